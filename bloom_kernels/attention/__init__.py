"""See reference.py (the definition) and triton_impl.py (the kernel, imported lazily)."""
