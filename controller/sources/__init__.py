"""Where samples come from: the probes, the hook channel, NVML and recorded files
(``readers``), the cluster's Prometheus (``promql``, ``promql_config``), and the
bounded gate to the bus every live sample passes (``intake``)."""
