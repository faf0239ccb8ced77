"""TLS for the control channel: a certificate made per run, and a tunnel per connection.

The channel is ``multiprocessing.connection``, which reads and writes raw file
descriptors, so TLS cannot sit inside it. Each TLS connection is instead terminated by a
pump thread that owns the TCP socket and a ``socketpair``: the caller gets the plain end,
wraps it in a ``Connection``, and everything else (the HMAC challenge with the run
secret, ``poll``, ``multiprocessing.connection.wait``, the end of the stream when the
peer dies) works as over TCP.

The driver makes a self-signed certificate and key per run, in memory (the key touches
disk only for the moment ``ssl`` loads it, in a private temporary directory); workers
receive the certificate in their bootstrap and trust that one certificate only, so only
the driver of this run can answer them. Workers are still authenticated by the HMAC
challenge inside the tunnel. TLS 1.3 only.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import logging
import os
import select
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass

from cairn._src.errors import ConfigError

logger = logging.getLogger(__name__)

_COMMON_NAME = "cairn-control-channel"
# The key dies with the driver, so a long validity costs nothing and no run outlives it.
_VALID_DAYS = 3650
_CHUNK = 65536
# Bytes buffered per direction before the pump stops reading that side (back-pressure).
_BUFFER_LIMIT = 4 << 20
# How long a tunnel that finished sending waits for the peer to close its side.
_LINGER_S = 5.0
# Poll events that let a read (or a send) go ahead; an error or hang-up does too, and the
# read or send then reports it.
_READABLE = select.POLLIN | select.POLLHUP | select.POLLERR
_WRITABLE = select.POLLOUT | select.POLLHUP | select.POLLERR


@dataclass(frozen=True)
class RunCertificate:
    """The driver's certificate (PEM, public: it travels to workers) and TLS context."""

    certificate_pem: str
    server_context: ssl.SSLContext


def make_run_certificate(host: str, *, generator: str | None = None) -> RunCertificate:
    """A fresh self-signed certificate and key for ``host``, as a server context.

    Made with the ``cryptography`` package when it is installed (Ray depends on it),
    else with the ``openssl`` command; ``generator`` ("cryptography" or "openssl") forces
    one. Raises :class:`ConfigError` when neither is available.
    """
    if generator not in (None, "cryptography", "openssl"):
        raise ValueError(f"generator={generator!r} is not one of 'cryptography', 'openssl'")
    pair: tuple[bytes, bytes] | None = None
    if generator in (None, "cryptography"):
        pair = _with_cryptography(host)
    if pair is None and generator in (None, "openssl"):
        pair = _with_openssl(host)
    if pair is None:
        raise ConfigError(
            "TLS for the control channel (ScalingConfig(tls=True) or CAIRN_TLS=1) needs a "
            "certificate generator: install the 'cryptography' package (pip install "
            "cryptography) or the 'openssl' command on the driver's machine."
        )
    certificate, key = pair
    directory = tempfile.mkdtemp(prefix="cairn-tls-")
    try:
        os.chmod(directory, 0o700)
        cert_path = os.path.join(directory, "cert.pem")
        key_path = os.path.join(directory, "key.pem")
        with open(cert_path, "wb") as out:
            out.write(certificate)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(cert_path, key_path)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return RunCertificate(certificate.decode("ascii"), context)


def client_context(certificate_pem: str) -> ssl.SSLContext:
    """A context that trusts exactly the run's certificate (pinned, whatever the host
    name: the worker dials the address its bootstrap names)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=certificate_pem)
    return context


def _subject_alt_names(host: str) -> list[str]:
    names = ["localhost"]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host:
            names.append(host)
        return names
    return [*names, f"IP:{host}"]


def _with_cryptography(host: str) -> tuple[bytes, bytes] | None:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        return None
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _COMMON_NAME)])
    alt: list[x509.GeneralName] = []
    for entry in _subject_alt_names(host):
        if entry.startswith("IP:"):
            alt.append(x509.IPAddress(ipaddress.ip_address(entry[3:])))
        else:
            alt.append(x509.DNSName(entry))
    now = datetime.datetime.now(datetime.timezone.utc)
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public),
                       critical=False)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     crl_sign=False, encipher_only=False,
                                     decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


def _with_openssl(host: str) -> tuple[bytes, bytes] | None:
    executable = shutil.which("openssl")
    if executable is None:
        return None
    alt = ",".join(entry if entry.startswith("IP:") else f"DNS:{entry}"
                   for entry in _subject_alt_names(host))
    directory = tempfile.mkdtemp(prefix="cairn-tls-")
    try:
        os.chmod(directory, 0o700)
        cert_path = os.path.join(directory, "cert.pem")
        key_path = os.path.join(directory, "key.pem")
        result = subprocess.run(
            [executable, "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key_path, "-out", cert_path,
             "-days", str(_VALID_DAYS), "-subj", f"/CN={_COMMON_NAME}",
             "-addext", f"subjectAltName={alt}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            check=False, timeout=60,
        )
        if result.returncode != 0:
            logger.warning("openssl could not make the run's certificate: %s",
                           result.stdout.decode(errors="replace").strip())
            return None
        with open(cert_path, "rb") as cert, open(key_path, "rb") as key:
            return cert.read(), key.read()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# --- the tunnel ----------------------------------------------------------------------------


def open_server_tunnel(sock: socket.socket, context: ssl.SSLContext,
                       timeout_s: float) -> socket.socket:
    """Run the server side of the TLS handshake on ``sock`` (an accepted connection),
    then hand back the plain end of a tunnel to it. Raises ``OSError`` (``ssl.SSLError``,
    ``TimeoutError``, ``ConnectionError``) when the handshake fails; ``sock`` is closed."""
    return _open_tunnel(sock, context, server_side=True, timeout_s=timeout_s)[0]


class ClientTunnel:
    """The client side of a TLS tunnel: the plain end to talk on, and its pump thread."""

    def __init__(self, plain: socket.socket, pump: threading.Thread) -> None:
        self.socket = plain
        self._pump = pump

    def wait_closed(self, timeout_s: float) -> bool:
        """Wait until the tunnel has delivered what it holds and closed (a worker about to
        exit; close the plain end first). Whether it has."""
        self._pump.join(timeout_s)
        return not self._pump.is_alive()


def open_client_tunnel(sock: socket.socket, context: ssl.SSLContext,
                       timeout_s: float) -> ClientTunnel:
    """The client side of :func:`open_server_tunnel` (a worker dialling the driver)."""
    return ClientTunnel(*_open_tunnel(sock, context, server_side=False, timeout_s=timeout_s))


def _open_tunnel(sock: socket.socket, context: ssl.SSLContext, *, server_side: bool,
                 timeout_s: float) -> tuple[socket.socket, threading.Thread]:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_side=server_side)
    try:
        _handshake(sock, tls, incoming, outgoing, time.monotonic() + timeout_s)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        plain, inner = socket.socketpair()
    except BaseException:
        sock.close()
        raise
    pump = _Pump(sock, inner, tls, incoming, outgoing)
    thread = threading.Thread(target=pump.run, name="cairn-tls-pump", daemon=True)
    thread.start()
    return plain, thread


def _handshake(sock: socket.socket, tls: ssl.SSLObject, incoming: ssl.MemoryBIO,
               outgoing: ssl.MemoryBIO, deadline: float) -> None:
    while True:
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            _send_all(sock, outgoing.read(), deadline)
            sock.settimeout(_remaining(deadline))
            data = sock.recv(_CHUNK)
            if not data:
                raise ConnectionError("the peer closed the connection during the TLS "
                                      "handshake") from None
            incoming.write(data)
            continue
        _send_all(sock, outgoing.read(), deadline)
        return


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the TLS handshake did not finish in time")
    return left


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    if data:
        sock.settimeout(_remaining(deadline))
        sock.sendall(data)


class _Pump:
    """Moves bytes between the TLS peer and the plain end, both ways, on one thread.

    Non-blocking, with a bounded buffer per direction, so neither direction can stall the
    other. When either side ends, what is buffered for the other is delivered, then both
    close: the plain end's reader sees the end of the stream as it would over TCP.
    """

    def __init__(self, tcp: socket.socket, plain: socket.socket, tls: ssl.SSLObject,
                 incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO) -> None:
        self._tcp = tcp
        self._plain = plain
        self._tls = tls
        self._incoming = incoming
        self._outgoing = outgoing

    def run(self) -> None:
        tcp, plain = self._tcp, self._plain
        to_tcp = bytearray(self._outgoing.read())
        to_plain = bytearray()
        tcp_open = plain_open = tcp_writable = True
        poller = select.poll()
        try:
            tcp.setblocking(False)
            plain.setblocking(False)
            # Records that arrived with the end of the handshake are already buffered.
            tcp_open = self._decrypt(to_plain)
            to_tcp += self._outgoing.read()
            while True:
                if not tcp_open and not to_plain:
                    return
                if not plain_open and not to_tcp:
                    if tcp_writable:
                        _finish_sending(tcp)
                    return
                # poll, not select: a driver with many files open has descriptors past
                # select's limit (FD_SETSIZE, 1024).
                # A socket with nothing to wait for is not polled at all: a hang-up on it
                # would be reported at every poll, and the loop would spin.
                wanted: dict[int, tuple[socket.socket, bool, bool]] = {}
                for sock, read, pending in ((tcp, tcp_open and len(to_plain) < _BUFFER_LIMIT,
                                             bool(to_tcp)),
                                            (plain, plain_open and len(to_tcp) < _BUFFER_LIMIT,
                                             bool(to_plain))):
                    if read or pending:
                        poller.register(sock, (select.POLLIN if read else 0)
                                        | (select.POLLOUT if pending else 0))
                        wanted[sock.fileno()] = (sock, read, pending)
                    else:
                        with contextlib.suppress(KeyError):
                            poller.unregister(sock)
                ready_r, ready_w = [], []
                for fd, event in poller.poll():
                    sock, read, pending = wanted[fd]
                    if read and event & _READABLE:
                        ready_r.append(sock)
                    if pending and event & _WRITABLE:
                        ready_w.append(sock)
                if tcp in ready_r:
                    data = _receive(tcp)
                    if data is None:
                        pass
                    elif data:
                        self._incoming.write(data)
                        tcp_open = self._decrypt(to_plain)
                    else:
                        tcp_open = False
                    to_tcp += self._outgoing.read()
                if plain in ready_r:
                    data = _receive(plain)
                    if data and tcp_writable:
                        self._tls.write(data)
                        to_tcp += self._outgoing.read()
                    elif data is not None and not data:
                        plain_open = False
                if tcp in ready_w and not _send_some(tcp, to_tcp):
                    # The peer is gone. What it sent before is still delivered: a worker's
                    # last message must not be lost to a broadcast it no longer reads.
                    tcp_writable = False
                    to_tcp.clear()
                if plain in ready_w and not _send_some(plain, to_plain):
                    plain_open = False
                    to_plain.clear()
        except (OSError, ValueError) as exc:
            logger.debug("TLS tunnel closed: %s", exc)
        finally:
            for sock in (plain, tcp):
                try:
                    sock.close()
                except OSError:
                    pass

    def _decrypt(self, into: bytearray) -> bool:
        """Append what the TLS records received so far hold; False once the peer ended."""
        while True:
            try:
                chunk = self._tls.read(_CHUNK)
            except ssl.SSLWantReadError:
                return True
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return False
            except ssl.SSLError as exc:
                # Debug only: a peer that sends a bad record before it authenticated is
                # logged once per address by the controller's refusal log; one that had
                # authenticated is reported as that rank's lost connection.
                logger.debug("Closing a control-channel connection: a TLS record could not "
                             "be read (%s)", exc)
                return False
            if not chunk:
                return False
            into += chunk


def _finish_sending(tcp: socket.socket) -> None:
    """End our direction, then read until the peer ends its own (bounded).

    Closing a TCP socket that still holds unread data sends a reset, and a reset makes
    the peer drop what we sent and it has not read yet: the last message of a worker.
    """
    try:
        tcp.shutdown(socket.SHUT_WR)
    except OSError:
        return
    deadline = time.monotonic() + _LINGER_S
    poller = select.poll()
    poller.register(tcp, select.POLLIN)
    while (left := deadline - time.monotonic()) > 0:
        if poller.poll(left * 1000) and _receive(tcp) == b"":
            return


def _receive(sock: socket.socket) -> bytes | None:
    """Bytes read, ``b""`` at the end of the stream (or a reset), None if none yet."""
    try:
        return sock.recv(_CHUNK)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


def _send_some(sock: socket.socket, buffer: bytearray) -> bool:
    """Send what the socket takes now; False when the peer is gone."""
    try:
        sent = sock.send(buffer)
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False
    del buffer[:sent]
    return True
