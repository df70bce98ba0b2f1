"""Laws, configuration, the Python API, reports and the command line."""
