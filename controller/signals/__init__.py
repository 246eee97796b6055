"""The signal catalogue: the names a policy may use (``catalogue``), what can produce
each on a node (``producers``), and which values and timestamps samples may carry
(``values``)."""
