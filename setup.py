"""fastdata's C extensions (see fastdata/kernels/); everything else is in pyproject.toml.
All optional: where they do not compile, the install goes on and fastdata uses torch ops
(shard maps go unguarded, JPEG records are decoded whole)."""
from setuptools import Extension, setup

# Neither FP exceptions nor errno are read: without them GCC turns the kernels' branches on
# floats into vector selects. No NaN, infinity or sign of zero is either (the kernels' values are
# pixels): GCC then makes a clamp a min and a max rather than compares and blends.
FAST_MATH = ["-fno-trapping-math", "-fno-math-errno", "-ffinite-math-only", "-fno-signed-zeros"]
# Hot loops on cache-line boundaries: otherwise where an unchanged loop lands moves with every
# edit elsewhere in the file, and its speed with it (docs/performance.md)
ALIGN = ["-falign-loops=64"]

setup(ext_modules=[
    Extension("fastdata.kernels._native", ["fastdata/kernels/_native.c"], optional=True,
              extra_compile_args=FAST_MATH + ALIGN),
    Extension("fastdata.kernels._guard", ["fastdata/kernels/_guard.c"], optional=True),
    # JPEG records decoded where their crops need them: needs libjpeg-turbo's headers
    # (libjpeg-turbo's libjpeg-dev; install.sh installs them where it can)
    Extension("fastdata.kernels._jpeg", ["fastdata/kernels/_jpeg.c"], libraries=["jpeg"],
              optional=True),
])
