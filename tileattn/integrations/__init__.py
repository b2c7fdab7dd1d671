"""Integrations with other libraries, each an optional dependency that `import tileattn` never
imports. Import the one you use:

    from tileattn.integrations import huggingface   # transformers >= 5: an attention backend
    from tileattn.integrations import sdpa          # torch >= 2.13: SDPA's flash-attention slot
"""
