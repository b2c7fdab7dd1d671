"""Triton and Gluon kernels: the launch runtime (runtime.py), ahead-of-time compilation for
tests (compile.py), and one folder per kernel family (attention/, mla/) with one file per
kernel and architecture, each with its config table and launcher."""
