"""Test set-up: kernels run on the `sim` backend, whatever the machine."""

import os

os.environ.setdefault("MTWORK_BACKEND", "sim")
