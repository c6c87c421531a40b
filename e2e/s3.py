"""A real S3-compatible server for the s3:// tests: moto's standalone server
on 127.0.0.1, and a fault-injecting proxy in front of it.

    python e2e/s3.py save s3://BUCKET/PREFIX REF --world 2

writes a tiny Llama with torch DCP straight to the bucket, through
FsspecWriter and s3fs, on `world` gloo ranks (REF: save_pretrained of the
same model), with config.json beside it. The AWS_* environment must point
at the server (Moto.env)."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Moto:
    """moto's server on a free port; env is what clients need to reach it."""

    def __init__(self):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint,
                    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError("moto server did not start")
                time.sleep(0.1)

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def stop(self):
        """Stop the server answering (SIGSTOP): connections hang."""
        self.proc.send_signal(signal.SIGSTOP)

    def cont(self):
        self.proc.send_signal(signal.SIGCONT)

    def close(self):
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait()


SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message><RequestId>proxy</RequestId></Error>")


class FaultProxy:
    """An HTTP/1.1 proxy in front of `upstream` (host, port), in a thread of
    its own. Of every `every` requests, one is answered 503 SlowDown and one
    GET is forwarded but its body cut halfway (the connection closed), when
    faults are on. down() refuses connections (and drops the open ones),
    up() serves again on the same port."""

    def __init__(self, upstream, every=4):
        self.upstream, self.every = upstream, every
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.faults = True
        self.n = self.slowdowns = self.cuts = 0
        self.loop = asyncio.new_event_loop()
        self.writers = set()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.up()

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def up(self):
        async def start():
            self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
        self._run(start())

    def down(self):
        async def stop():
            self.server.close()
            for w in list(self.writers):
                w.transport.abort()
            await asyncio.sleep(0.1)  # the aborts close their sockets in callbacks
            await self.server.wait_closed()
        self._run(stop())

    def close(self):
        self.down()
        self.loop.call_soon_threadsafe(self.loop.stop)

    async def _serve(self, reader, writer):
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method = lines[0].split(" ")[0]
                headers = [ln for ln in lines[1:] if ln and not ln.lower().startswith("connection:")]
                length = next((int(ln.split(":", 1)[1]) for ln in headers if ln.lower().startswith("content-length:")), 0)
                body = await reader.readexactly(length) if length else b""
                self.n += 1
                fault = self.faults and self.n % self.every
                if fault == 1:
                    self.slowdowns += 1
                    writer.write(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                                 b"Content-Length: %d\r\n\r\n" % len(SLOWDOWN) + (b"" if method == "HEAD" else SLOWDOWN))
                    await writer.drain()
                    continue
                # One upstream connection per request, closed by the server
                # after its response: the response is everything it sends.
                ur, uw = await asyncio.open_connection(*self.upstream)
                req = "\r\n".join([lines[0], *headers, "Connection: close", "", ""]).encode("latin-1")
                uw.write(req + body)
                await uw.drain()
                resp = await ur.read()
                uw.close()
                split = resp.find(b"\r\n\r\n") + 4
                if fault == 2 and method == "GET" and len(resp) - split > 1:
                    self.cuts += 1
                    writer.write(resp[:split + (len(resp) - split) // 2])
                    await writer.drain()
                    writer.transport.abort()
                    return
                writer.write(resp)
                await writer.drain()
                if b"\r\nconnection: close" in resp[:split].lower():
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()


def _save_worker(rank, world, init_method, url, ref):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FsspecWriter
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    import models

    models.join(rank, world, init_method)
    model = models.build("float32")
    if rank == 0:
        model.save_pretrained(ref)
    models.shard(model, "fsdp2", world)
    dcp.save(get_model_state_dict(model), storage_writer=FsspecWriter(url))
    dist.barrier()
    if rank == 0:
        import fsspec

        with open(os.path.join(ref, "config.json"), "rb") as src, fsspec.open(url + "/config.json", "wb") as dst:
            dst.write(src.read())
    models.leave()


if __name__ == "__main__":
    import argparse

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["save"])
    ap.add_argument("url")
    ap.add_argument("ref")
    ap.add_argument("--world", type=int, default=2)
    a = ap.parse_args()
    import models

    models.spawn(_save_worker, a.world, a.url, a.ref)
