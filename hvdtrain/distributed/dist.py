"""Temporary: the old flat seam, re-exported while call sites move to the modules split by concern."""
from hvdtrain.distributed.collectives import *  # noqa: F403
from hvdtrain.distributed.elastic_state import *  # noqa: F403
from hvdtrain.distributed.gradients import *  # noqa: F403
from hvdtrain.distributed.runtime import *  # noqa: F403
from hvdtrain.distributed.runtime import IMPORT_ERROR as _IMPORT_ERROR  # noqa: F401
from hvdtrain.distributed.settings import *  # noqa: F403
from hvdtrain.distributed.sync_bn import *  # noqa: F403
from hvdtrain.distributed.wait import *  # noqa: F403
