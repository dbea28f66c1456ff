"""Rank-side: every rank says where it runs (host name, interface address, network namespace),
rank 0 writes all of it to $WHERE_FILE, then every rank trains with the given hvdtrain arguments."""
import fcntl
import json
import os
import socket
import struct
import sys

from hvdtrain.cli.main import main
from hvdtrain.distributed import collectives, runtime

SIOCGIFADDR = 0x8915  # Linux ioctl: the IPv4 address of an interface


def interface_address(name: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        reply = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
    return socket.inet_ntoa(reply[20:24])


world = runtime.init()
me = {"rank": world.rank, "hostname": socket.gethostname(), "address": interface_address(os.environ["WHERE_IFACE"]),
      "netns": os.readlink("/proc/self/ns/net")}
everyone = collectives.allgather_object(me, name="where")  # a real allgather across the hosts
if world.is_root:
    with open(os.environ["WHERE_FILE"], "w") as file:
        json.dump(everyone, file)
sys.exit(main(sys.argv[1:]))
