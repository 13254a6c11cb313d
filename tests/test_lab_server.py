"""`make lab` starts Jupyter Lab safely: loopback only, and every request needs the token."""

from pathlib import Path

from labserver import api_request, lab_server  # tests/labserver.py


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket listening on `port`, read from /proc/net/tcp{,6} (no traffic sent)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.split(":")
            if int(hex_port, 16) == port and state == "0A":  # 0A = LISTEN
                found.add(addr)
    return found


def test_lab_refuses_requests_without_the_token_and_listens_on_loopback_only():
    with lab_server() as lab:
        assert lab.url.startswith("http://127.0.0.1:")
        status, body = api_request(lab.url + "api/status", token=lab.token)
        assert status == 200 and "started" in body
        status, _ = api_request(lab.url + "api/status")  # no token
        assert status in (401, 403)
        status, _ = api_request(lab.url + "api/contents", token="not-the-token")
        assert status in (401, 403)
        addrs = _listening_addresses(lab.port)
        if addrs:  # Linux: 127.0.0.1 is 0100007F in /proc; 0.0.0.0 would be 00000000
            assert addrs == {"0100007F"}, f"Jupyter listens on {addrs}, not 127.0.0.1 only"
