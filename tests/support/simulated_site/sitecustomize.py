"""Installs the simulated machine of ``$DIFFGEMMA_SIMULATED_MACHINE`` in a child process (``tests.support.devices``):
a test puts this folder and the repository on ``PYTHONPATH`` to simulate the machine in a command it starts (the
plan that ``diffgemma-lsp doctor --plan`` runs in a subprocess)."""

import os

if os.environ.get("DIFFGEMMA_SIMULATED_MACHINE"):
    from tests.support.devices import install_from_environment

    install_from_environment()
