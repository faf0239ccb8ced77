"""Imported only by a warm standby spare (CAIRN_PRELOAD) in test_ray_backend.py."""
