"""Simulated nodes for reflexarc: scenario files, the plant that plays them, and
simulated actuators, so policies can be tried in simulated time.

Example::

    from reflexarc.simulations import Plant, list_scenarios, load_scenario
    sc = load_scenario("numa-remote-worker")
    plant = Plant(sc, seed=sc.seed)
    plant.step(0.0, lambda name, labels, value, ts: print(name, labels, value))

Overhead: importing loads PyYAML and the actuator specs; nothing runs at import.
"""
from .expect import Expectation, ExpectedAction, check_expectation
from .plant import Plant
from .scenario import Fault, Scenario, ScenarioError, Series, list_scenarios, load_scenario

__all__ = ["Expectation", "ExpectedAction", "Fault", "Plant", "Scenario", "ScenarioError", "Series",
           "check_expectation", "list_scenarios", "load_scenario"]
