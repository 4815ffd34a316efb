"""The one C extension (fastdata/_native.c, see fastdata/native.py); everything else is in
pyproject.toml. Optional: where it does not compile, the install goes on and fastdata uses
torch ops instead."""
from setuptools import Extension, setup

# Neither FP exceptions nor errno are read: without them GCC turns the kernels' branches on
# floats into vector selects (the hue kernel ran an order of magnitude slower as scalar code).
# No NaN, infinity or sign of zero is either (the kernels' values are pixels): GCC then makes a
# clamp a min and a max rather than compares and blends (ColorJitter's cost: docs/performance.md)
setup(ext_modules=[Extension("fastdata._native", ["fastdata/_native.c"], optional=True,
                             extra_compile_args=["-fno-trapping-math", "-fno-math-errno",
                                                 "-ffinite-math-only", "-fno-signed-zeros"])])
