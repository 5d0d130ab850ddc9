"""Mixture-of-experts layers: routing, the experts' products (a per-expert reference and a fused
Triton kernel), and experts split across ranks."""
