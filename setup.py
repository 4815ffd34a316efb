"""fastdata's two C extensions (see fastdata/kernels/); everything else is in pyproject.toml.
Both optional: where they do not compile, the install goes on and fastdata uses torch ops
(and shard maps go unguarded)."""
from setuptools import Extension, setup

# Neither FP exceptions nor errno are read: without them GCC turns the kernels' branches on
# floats into vector selects. No NaN, infinity or sign of zero is either (the kernels' values are
# pixels): GCC then makes a clamp a min and a max rather than compares and blends.
FAST_MATH = ["-fno-trapping-math", "-fno-math-errno", "-ffinite-math-only", "-fno-signed-zeros"]

setup(ext_modules=[
    Extension("fastdata.kernels._native", ["fastdata/kernels/_native.c"], optional=True,
              extra_compile_args=FAST_MATH),
    Extension("fastdata.kernels._guard", ["fastdata/kernels/_guard.c"], optional=True),
])
