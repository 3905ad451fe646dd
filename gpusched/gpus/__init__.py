"""GPUs behind the narrow `Probe` interface: the interface, the selection of cards and the
simulated GPUs (probe), NVIDIA's NVML (nvml, imported only by a daemon that uses it).
"""
