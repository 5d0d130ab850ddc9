"""Decode's small products: Triton kernels that read each weight once for 1 to 8 rows."""
