"""packer's benchmarks: run them as modules, e.g. ``python -m benchmarks.convert_and_read``."""
