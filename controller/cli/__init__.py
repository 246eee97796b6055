"""The ``reflexarc`` command line: ``main`` (the parser and ``main()``), one module
per verb (``run``, ``act``, ``top``, ...), and what the verbs share (``shared``)."""
