"""``reflexarc simulate``, ``reflexarc test-policies``: the controller on
scenarios in simulated time (``runtime.simulate``). ``simulate`` runs one
scenario and writes its audit log and report; ``test-policies`` runs each case
of the policy test files (``runtime.policy_tests``) and exits 1 when the
actions taken are not the ones expected.

Example::

    reflexarc simulate --list
    reflexarc simulate dataloader-starvation --out out/starvation
    reflexarc test-policies policies/tests/

Overhead: the simulation's: simulated time runs as fast as the controller ticks.
"""
from __future__ import annotations

from .shared import CliError, _load_policies, _output_dir


def cmd_simulate(args) -> int:
    from reflexarc.simulations import ScenarioError, list_scenarios
    if args.list or not args.scenario:
        for name, desc in list_scenarios():
            print(f"{name:24s} {desc}")
        return 0
    from reflexarc.controller.report import format_summary_table, summarize

    from ..runtime.simulate import run_scenario
    out = _output_dir(args.out or f"out/{args.scenario.replace('/', '_')}")
    policies = _load_policies(args.policy) if args.policy else None
    try:
        result = run_scenario(args.scenario, policies, args.mode, out, report=True,
                              evals="all" if args.all_evals else "sampled")
    except ScenarioError as exc:
        raise CliError(str(exc)) from None
    print(format_summary_table(summarize(result.records)))
    print(f"audit:  {result.audit_path}")
    print(f"report: {result.reports.get('html')}")
    return 0


def cmd_test_policies(args) -> int:
    from ..runtime.policy_tests import run_policy_tests
    failed = run_policy_tests(args.paths, verbose=args.verbose)
    if failed:
        raise CliError(f"{failed} policy test(s) failed")
    return 0
