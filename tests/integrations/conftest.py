"""Tests of cairn.huggingface and cairn.lightning; each module skips without its framework."""

from __future__ import annotations

import os
import sys

# The workload modules are imported by name here and in the worker processes.
sys.path.insert(0, os.path.dirname(__file__))
