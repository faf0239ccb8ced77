"""Callbacks and helpers that report from Hugging Face Transformers and Lightning trainers."""
