"""One run: its configuration (RunConfig), the Python API that simulates it,
the memory check every run passes first, and the guard on the files it writes."""
