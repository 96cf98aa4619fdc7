"""Pod networking for the install tests' node: one Linux bridge on this machine and Debian's CNI plugins
(``containernetworking-plugins``: bridge, host-local, loopback), as a one-node cluster without an
overlay runs it.

```text
host: bridge gse2e0, 10.244.77.1/24 (made here, before the API server binds that address)
  pod: veth in its own network namespace, 10.244.77.x/24 from host-local, default route via .1
API server on 10.244.77.1: the pods reach it there (the chart's kubernetesService values), and it
  reaches a webhook pod at its endpoint address (--enable-aggregator-routing), with no kube-proxy
```

No iptables rule is written (``ipMasq`` off: the pods talk only to this host), the addresses are
handed out from a folder under the node's own (``dataDir``), and ``down`` deletes the bridge, so the
machine is left as it was. One such network per machine at a time: ``up`` refuses when the bridge or
the subnet is in use already.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CNI_BIN", "GATEWAY", "PodNetwork"]

CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
BRIDGE = "gse2e0"
SUBNET = "10.244.77.0/24"
GATEWAY = "10.244.77.1"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@dataclass
class PodNetwork:
    """The bridge and the CNI configuration of one node; ``up`` before the API server starts."""

    root: Path
    bridge: str = BRIDGE
    subnet: str = SUBNET
    gateway: str = GATEWAY

    def up(self) -> None:
        missing = [p for p in ("bridge", "host-local", "loopback") if not (CNI_BIN / p).is_file()]
        if missing:
            raise RuntimeError(
                f"no CNI plugin {', '.join(missing)} in {CNI_BIN}: "
                "apt-get install containernetworking-plugins"
            )
        if _ip("link", "show", self.bridge, check=False).returncode == 0:
            raise RuntimeError(f"bridge {self.bridge} exists already: one install-test node per machine")
        if _ip("route", "show", self.subnet).stdout.strip():
            raise RuntimeError(f"{self.subnet} is routed on this machine already: pick another subnet")
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.down()
            raise
        self.root.mkdir(parents=True, exist_ok=True)

    def conflist(self) -> str:
        """The CNI configuration containerd reads (``conf_dir``)."""
        return json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "gpuslice-e2e",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": self.bridge,
                        "isGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": self.subnet, "gateway": self.gateway}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": str(self.root / "ipam"),
                        },
                    },
                    {"type": "loopback"},
                ],
            },
            indent=1,
        )

    def down(self) -> None:
        """Delete the bridge (the pods' veths went with their namespaces, or go with it)."""
        _ip("link", "del", self.bridge, check=False)
