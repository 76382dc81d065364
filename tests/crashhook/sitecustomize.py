"""Read by Python at start in the operator processes the restart tests start with this folder
on PYTHONPATH (k8s_helpers.Operator.start_with): installs their crash-point hook."""

from crashhook import install_from_env

install_from_env()
