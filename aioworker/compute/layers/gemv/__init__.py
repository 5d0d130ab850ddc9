"""Matrix-vector products for decode's few rows (issue 22): one kernel family, weights read once."""
