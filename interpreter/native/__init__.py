"""The optional native parts (C/C++ sources here, built by setup.py) and their Python
wrappers: the BLAS preload and router, native activations, the quantized kernel."""
