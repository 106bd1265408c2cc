"""The per-node cache daemon: its server, the client readers use, and their wire protocol."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "DaemonClient": "client",
    "connect": "protocol", "recv_msg": "protocol", "send_msg": "protocol",
    "CacheDaemon": "server", "ConnectionLimits": "server", "DaemonOptions": "server",
    "DatasetAccess": "access", "read_token": "access", "ReaderWindows": "budget",
})
