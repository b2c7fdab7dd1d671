"""The ops behind the public functions: each module orchestrates one op (checks, kernel choice,
layouts, allocation, launches, call cache)."""
