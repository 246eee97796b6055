"""The engine: the bus the sources publish to, each rule's lifecycle per target, and
the executor that journals every change before it is made.

``engine.Controller`` evaluates every policy's rules each tick over the ``bus``
(``targets`` resolves, ``evaluate`` reads windows), carries out what each
``lifecycle.RuleRun`` decides through the ``executor`` (plan, diff, ``journal``,
apply, read back) under the node's ``limits``, and writes the ``audit`` log and
``metrics``. Nothing here reads the node: sources feed it, runtimes drive it.
"""
