"""The tensor-parallel rendezvous: two ranks meet, and given a socket bound to the group's host,
the store listens there alone (torch's own server would listen on every interface)."""

from __future__ import annotations

import ipaddress
import multiprocessing
import socket

import torch
import torch.distributed as dist

from aioworker.compute.parallel import init_tensor_parallel


def listening_addresses(port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Local addresses of the sockets listening on `port`, as the kernel lists them."""
    found = []
    for table, decode in (("/proc/net/tcp", _ipv4), ("/proc/net/tcp6", _ipv6)):
        with open(table) as rows:
            for row in rows.read().splitlines()[1:]:
                _, local, _, state, *_ = row.split()
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.append(decode(address))
    return found


def _ipv4(hex_address: str) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(bytes.fromhex(hex_address)[::-1])  # stored little-endian


def _ipv6(hex_address: str) -> ipaddress.IPv6Address:
    words = (bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, 32, 8))
    return ipaddress.IPv6Address(b"".join(words))


def _is_loopback(address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _listening_socket(host: str, port: int) -> socket.socket:
    """What the caller that binds the group's endpoints hands rank 0."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen()
    return sock


def _join_group(rank: int, port: int, joined, inspected, sums) -> None:
    listen_fd = _listening_socket("127.0.0.1", port).detach() if rank == 0 else None
    tp = init_tensor_parallel(rank, 2, f"tcp://127.0.0.1:{port}", "gloo", listen_fd)
    joined.put(rank)
    inspected.wait(60)  # the store stays up while the test reads the listening sockets
    sums.put(tp.all_reduce(torch.tensor([rank + 1.0])).item())
    dist.destroy_process_group()


def test_the_rendezvous_listens_on_the_group_host_alone() -> None:
    context = multiprocessing.get_context("spawn")
    port = _free_port()
    joined, sums, inspected = context.Queue(), context.Queue(), context.Event()
    ranks = [
        context.Process(target=_join_group, args=(rank, port, joined, inspected, sums))
        for rank in range(2)
    ]
    for process in ranks:
        process.start()
    try:
        assert sorted(joined.get(timeout=60) for _ in ranks) == [0, 1]
        addresses = listening_addresses(port)
        inspected.set()
        assert [sums.get(timeout=60) for _ in ranks] == [3.0, 3.0]
    finally:
        inspected.set()
        for process in ranks:
            process.join(30)
            if process.is_alive():
                process.kill()
    assert addresses and all(_is_loopback(a) for a in addresses), addresses
