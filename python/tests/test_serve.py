"""`allocsim serve` from the wheel (which embeds the viewer): a bad FILE and a busy port
are exit-2 errors before serving; the server answers the site, the trace and the redirect
that opens it (the page itself is checked in headless Chromium: web/tests/serve.mjs)."""

import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from conftest import trace, wheel_cli


def serve(*args):
    return subprocess.Popen([wheel_cli(), "serve", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_bad_file_is_exit_2_before_serving(tmp_path):
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"\x80\x04not a snapshot")
    for f in (bad, tmp_path / "missing.pickle"):
        out = subprocess.run([wheel_cli(), "serve", str(f), "--port", "0"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out
        assert out.stdout == "" and out.stderr.count("\n") == 1 and str(f) in out.stderr


@pytest.mark.parametrize("launcher", ["script", "module"])
def test_busy_port_is_exit_2_naming_it(launcher):
    argv = [wheel_cli()] if launcher == "script" else [sys.executable, "-m", "allocsim"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run([*argv, "serve", "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith(f"allocsim: port {port} on 127.0.0.1 is busy")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_serves_the_viewer_with_the_trace():
    story = trace("oom_story.pickle.gz")
    p = serve(story, "--port", "0")
    try:
        first = p.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", first)
        assert m, first
        port = m.group(1)
        assert f"ssh -L {port}:127.0.0.1:{port} " in p.stdout.readline()
        base = f"http://127.0.0.1:{port}"
        opener = urllib.request.build_opener(NoRedirect)
        with pytest.raises(urllib.error.HTTPError) as e:
            opener.open(base + "/")
        assert e.value.code == 302 and e.value.headers["Location"] == "/?trace=/trace/oom_story.pickle.gz"
        page = urllib.request.urlopen(base + "/?trace=/trace/oom_story.pickle.gz").read().decode()
        assert "allocsim_web.js" in page
        assert urllib.request.urlopen(base + "/trace/oom_story.pickle.gz").read() == story.read_bytes()
        wasm = urllib.request.urlopen(base + "/allocsim_web_bg.wasm")
        assert wasm.headers["Content-Type"] == "application/wasm" and wasm.read(4) == b"\0asm"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/../etc/passwd")
        assert e.value.code == 404
    finally:
        p.terminate()
        p.wait(timeout=30)
