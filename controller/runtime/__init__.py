"""What drives the engine: the loop on a node (``live``) with its control socket
(``control``, ``steer``), metrics endpoint (``exporter``, ``signal_metrics``),
service-manager notices (``sd_notify``), narration (``narrate``) and hot reload
(``reload``); and simulated time for scenarios and policy tests (``simulate``,
``policy_tests``)."""
