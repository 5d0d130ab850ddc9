"""Speculative decoding on the scheduler's side, torch-free: who proposes drafts (`proposer.py`,
`ngram.py`), how many each step may verify (`policy.py`), and the figures that say how well it
goes (`stats.py`)."""
