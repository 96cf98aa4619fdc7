"""Anomaly events read as sentences with units, not raw floats such as 7.51619e+10."""

from gpuslice.server.daemon import anomaly_text
from gpuslice.units import GiB


def test_memory_is_a_size_temperature_degrees_and_utilisation_percent():
    assert anomaly_text(3, "memory_used", 70 * GiB, 12.5 * GiB, 4.21) == (
        "GPU 3 memory used 70 GiB is 4.2 sigma from its recent mean 12.5 GiB"
    )
    assert anomaly_text(0, "temperature", 91.4, 60.2, 5.0) == (
        "GPU 0 temperature 91 °C is 5.0 sigma from its recent mean 60 °C"
    )
    assert anomaly_text(1, "utilization", 99.0, 20.3, 3.5) == (
        "GPU 1 utilization 99 % is 3.5 sigma from its recent mean 20 %"
    )
    assert "e+" not in anomaly_text(2, "memory_used", 7.51619e10, 2.0e9, 3.1)
