"""The benchmarks behind ``docs/performance.md``: a folder per subject, each script a module
run from the repository's root (``python -m benchmarks.loading.loaders_cpu ...``; their index:
``benchmarks/README.md``)."""
