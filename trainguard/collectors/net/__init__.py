"""The network collector: NICs, IB/RoCE ports, TCP retransmits, peer paths, link events."""

from trainguard.collectors.net.collector import NetCollector
from trainguard.collectors.net.peers import PeerSpec
from trainguard.collectors.net.probe import EchoProbe, EchoResponder

__all__ = ["EchoProbe", "EchoResponder", "NetCollector", "PeerSpec"]
