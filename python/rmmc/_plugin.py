# SPDX-License-Identifier: Apache-2.0
"""What rmmc.torch.use() and rmmc.cupy.use() share: the configuration
check (a broken RMMC_ALLOC_CONF raises here rather than at the first
allocation) and the default spec."""
import os

from ._lib import ParseError, RmmcError
from . import config_status, set_default

_ON = ("1", "true", "yes", "on")


def prepare(spec, device):
    """Sets `spec` as the default (see rmmc.set_default) if given; else
    raises if RMMC_ALLOC_CONF does not parse and the process did not opt
    into the fallback (RMMC_ALLOC_CONF_FALLBACK=1)."""
    if spec is not None:
        set_default(spec, device)
        return
    status, _, message = config_status()
    fallback = os.environ.get("RMMC_ALLOC_CONF_FALLBACK", "").strip().lower() in _ON
    if status != "SUCCESS" and not fallback:
        cls = ParseError if status == "ERROR_PARSE" else RmmcError
        raise cls({"ERROR_PARSE": -8}.get(status, -11), message,
                  "the process default (RMMC_ALLOC_CONF)")
