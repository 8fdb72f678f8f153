"""The hardware: the GPU catalog, NVML detection, and what one replica runs on."""
