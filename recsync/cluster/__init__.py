"""Where a run's processes run: joining Ray, placement, storage at URLs, devices, the
network, the emulated cluster."""
