# The acceptance suite's plugin: options, markers, host and recipe fixtures. The checks live in tests/.
pytest_plugins = ["pytester"]  # pytester: for the self-tests in selftest/
