"""A small network fault lab: namespaces joined by veth, and faults to inject into them.

``VethLab`` makes two network namespaces joined by a veth pair (10.x addresses that exist only
inside them) and tears everything down on exit: the processes it started, then the namespaces
(which takes the veth, nftables rules and qdiscs inside with them). ``faults`` adds nftables
random drops, tc tbf throttling and link flaps inside a lab's namespace; ``toxiproxy`` builds
and runs Toxiproxy on 127.0.0.1 for latency/jitter (this kernel has no netem). Every wait is
bounded. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2; nftables for drops.
"""

from trainguard.netlab.faults import NftDrop, Tbf, flap_link, set_link
from trainguard.netlab.ns import LabError, Netns, VethLab
from trainguard.netlab.procs import LineProcess
from trainguard.netlab.toxiproxy import ToxiproxyServer, ensure_toxiproxy_server

__all__ = [
    "LabError",
    "LineProcess",
    "Netns",
    "NftDrop",
    "Tbf",
    "ToxiproxyServer",
    "VethLab",
    "ensure_toxiproxy_server",
    "flap_link",
    "set_link",
]
