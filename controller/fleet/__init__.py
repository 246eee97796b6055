"""The fleet: what nodes share through a consistent store (etcd): the cluster-wide remediation budget."""
