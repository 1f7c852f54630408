"""A fake Hugging Face Hub on loopback, speaking the endpoints huggingface_hub 2.x uses for
hf_hub_download / snapshot_download, so that our C++ client and huggingface_hub itself can be
driven against the same server and their caches compared.

Two servers: the Hub on 127.0.0.1 (API and /resolve) and a "CDN" on 127.0.0.2, where /resolve
redirects LFS files as the real Hub does, so a client that keeps its token across the host change
is caught. Every request is logged; faults (a body cut mid-way, corrupted bytes) are switched on
per file. Hashes here come from hashlib and the git/LFS definitions, never from the code under
test.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".onnx", "tokenizer.json")


def git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class File:
    path: str
    content: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def pointer(self) -> bytes:
        return (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\n"
            f"size {len(self.content)}\n"
        ).encode()

    @property
    def blob_id(self) -> str:
        """The git blob id: of the LFS pointer for LFS files, as git stores it."""
        return git_blob_sha1(self.pointer if self.lfs else self.content)

    @property
    def etag(self) -> str:
        """What the Hub sends as X-Linked-Etag / ETag, and what the cache names the blob."""
        return self.sha256 if self.lfs else self.blob_id


@dataclass
class Commit:
    sha: str
    files: dict[str, File]


class Repo:
    """A model repo with named revisions (branches or tags), each a commit of files."""

    def __init__(
        self,
        repo_id: str,
        revisions: dict[str, dict[str, bytes]],
        *,
        gated: bool = False,
        private: bool = False,
    ):
        self.id = repo_id
        self.gated = gated
        self.private = private
        self.refs: dict[str, Commit] = {}
        for name, files in revisions.items():
            h = hashlib.sha1(repo_id.encode() + b"\0" + name.encode())
            for path in sorted(files):
                h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
            self.refs[name] = Commit(
                sha=h.hexdigest(),
                files={p: File(p, c, p.endswith(LFS_SUFFIXES)) for p, c in files.items()},
            )

    def commit(self, revision: str) -> Commit | None:
        if revision in self.refs:
            return self.refs[revision]
        return next((c for c in self.refs.values() if c.sha == revision), None)


@dataclass
class Request:
    server: str  # "hub" or "cdn"
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")


@dataclass
class Faults:
    cut_once: set[str] = field(default_factory=set)  # cut the next body of these files mid-way
    cut_at: dict[str, int] = field(default_factory=dict)  # cut every body at this byte offset
    corrupt_once: set[str] = field(default_factory=set)  # flip a byte of the next body
    corrupt_always: set[str] = field(default_factory=set)


class HubFixture:
    def __init__(self, token: str = "hf_fixture_token"):
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.faults = Faults()
        self.honour_blobs = True  # False: ignore ?blobs=true, as an older server would
        self.tree_page_size = 1000
        # The real Hub answers 401 rather than 404 to unauthenticated callers.
        self.missing_repo_status = 404
        self.cdn_delay_s = 0.0  # a slow CDN, so that concurrent clients overlap
        self._lock = threading.Lock()
        self._hub = self._serve("127.0.0.1", "hub")
        self._cdn = self._serve("127.0.0.2", "cdn")
        self.url = f"http://127.0.0.1:{self._hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.2:{self._cdn.server_address[1]}"

    def add(self, repo: Repo) -> Repo:
        self.repos[repo.id] = repo
        return repo

    def close(self) -> None:
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    def log(self, server: str | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if server is None or r.server == server]

    def clear_log(self) -> None:
        with self._lock:
            self.requests.clear()

    def _serve(self, host: str, name: str) -> ThreadingHTTPServer:
        fixture = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def do_GET(self):
                fixture._handle(self, name, "GET")

            def do_HEAD(self):
                fixture._handle(self, name, "HEAD")

        server = ThreadingHTTPServer((host, 0), Handler)
        server.daemon_threads = True
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return server

    # --- request handling ---

    def _handle(self, h: BaseHTTPRequestHandler, server: str, method: str) -> None:
        parts = urlsplit(h.path)
        req = Request(
            server,
            method,
            parts.path,
            parse_qs(parts.query),
            {k.lower(): v for k, v in h.headers.items()},
        )
        with self._lock:
            self.requests.append(req)
        try:
            if server == "cdn":
                self._cdn_get(h, req)
            elif parts.path.startswith("/api/models/"):
                self._api(h, req)
            elif "/resolve/" in parts.path:
                self._resolve(h, req)
            else:
                self._reply(h, req, 404, b"", {"X-Error-Code": "RepoNotFound"})
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _reply(
        self,
        h,
        req: Request,
        status: int,
        body: bytes,
        headers: dict | None = None,
        content_type: str = "application/octet-stream",
    ) -> None:
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if req.method != "HEAD":
            h.wfile.write(body)

    def _json(self, h, req: Request, payload, headers: dict | None = None) -> None:
        self._reply(h, req, 200, json.dumps(payload).encode(), headers, "application/json")

    def _error(
        self,
        h,
        req: Request,
        status: int,
        code: str,
        message: str,
        extra: dict | None = None,
    ) -> None:
        body = json.dumps({"error": message}).encode()
        self._reply(
            h,
            req,
            status,
            body,
            {"X-Error-Code": code, "X-Error-Message": message, **(extra or {})},
            "application/json",
        )

    def _authorized(self, req: Request) -> bool:
        return req.authorization == f"Bearer {self.token}"

    def _find_repo(self, h, req: Request, repo_id: str) -> Repo | None:
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and not self._authorized(req)):
            status = 404 if req.authorization else self.missing_repo_status
            self._error(h, req, status, "RepoNotFound", "Repository not found")
            return None
        return repo

    def _find_commit(self, h, req: Request, repo: Repo, revision: str) -> Commit | None:
        commit = repo.commit(revision)
        if commit is None:
            self._error(h, req, 404, "RevisionNotFound", "Invalid rev id: " + revision)
        return commit

    def _api(self, h, req: Request) -> None:
        # /api/models/{org}/{name}[/revision/{rev} | /tree/{rev}[/{path}]]; rev is quoted.
        segments = req.path[len("/api/models/") :].split("/")
        repo = self._find_repo(h, req, "/".join(segments[:2]))
        if repo is None:
            return
        rest = segments[2:]
        if not rest:
            kind, revision = "revision", "main"
        elif len(rest) >= 2 and rest[0] in ("revision", "tree"):
            kind, revision = rest[0], unquote(rest[1])
        else:
            self._error(h, req, 404, "EntryNotFound", "unknown API route")
            return
        commit = self._find_commit(h, req, repo, revision)
        if commit is None:
            return
        if kind == "revision":
            self._json(h, req, self._model_info(repo, commit, req))
        else:
            self._tree(h, req, commit, "/".join(unquote(s) for s in rest[2:]))

    def _model_info(self, repo: Repo, commit: Commit, req: Request) -> dict:
        blobs = req.query.get("blobs", ["false"])[0].lower() == "true" and self.honour_blobs
        siblings = []
        for f in commit.files.values():
            s = {"rfilename": f.path}
            if blobs:
                s["blobId"] = f.blob_id
                s["size"] = len(f.content)
                if f.lfs:
                    s["lfs"] = {
                        "sha256": f.sha256,
                        "size": len(f.content),
                        "pointerSize": len(f.pointer),
                    }
            siblings.append(s)
        return {
            "_id": "fixture",
            "id": repo.id,
            "modelId": repo.id,
            "sha": commit.sha,
            "private": repo.private,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "tags": [],
            "siblings": siblings,
        }

    def _tree(self, h, req: Request, commit: Commit, under: str) -> None:
        recursive = req.query.get("recursive", ["false"])[0].lower() == "true"
        entries, folders = [], set()
        for f in sorted(commit.files.values(), key=lambda f: f.path):
            if under and not f.path.startswith(under + "/"):
                continue
            rel = f.path[len(under) + 1 :] if under else f.path
            parts = rel.split("/")
            for i in range(1, len(parts)):
                folder = "/".join(([under] if under else []) + parts[:i])
                if folder not in folders and (recursive or i == 1):
                    folders.add(folder)
                    entries.append(
                        {
                            "type": "directory",
                            "oid": "0" * 40,
                            "size": 0,
                            "path": folder,
                        }
                    )
            if len(parts) > 1 and not recursive:
                continue
            e = {
                "type": "file",
                "oid": f.blob_id,
                "size": len(f.content),
                "path": f.path,
            }
            if f.lfs:
                e["lfs"] = {
                    "oid": f.sha256,
                    "size": len(f.content),
                    "pointerSize": len(f.pointer),
                }
            entries.append(e)
        start = int(req.query.get("cursor", ["0"])[0])
        page = entries[start : start + self.tree_page_size]
        headers = {}
        if start + self.tree_page_size < len(entries):
            nxt = (
                f"{self.url}{req.path}?recursive={str(recursive).lower()}"
                f"&cursor={start + self.tree_page_size}"
            )
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._json(h, req, page, headers)

    def _resolve(self, h, req: Request) -> None:
        # /{org}/{name}/resolve/{rev}/{path...}
        segments = req.path.lstrip("/").split("/")
        if len(segments) < 5 or segments[2] != "resolve":
            self._error(h, req, 404, "EntryNotFound", "bad resolve URL")
            return
        repo = self._find_repo(h, req, "/".join(segments[:2]))
        if repo is None:
            return
        commit = self._find_commit(h, req, repo, unquote(segments[3]))
        if commit is None:
            return
        if repo.gated and not self._authorized(req):
            status = 403 if req.authorization else 401
            message = (
                f"Access to model {repo.id} is restricted and you are not in the authorized "
                f"list. Visit {self.url}/{repo.id} to ask for access."
                if req.authorization
                else f"Access to model {repo.id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in."
            )
            self._error(h, req, status, "GatedRepo", message)
            return
        path = unquote("/".join(segments[4:]))
        f = commit.files.get(path)
        meta = {"X-Repo-Commit": commit.sha}
        if f is None:
            self._error(h, req, 404, "EntryNotFound", f"{path} does not exist", meta)
            return
        if f.lfs:
            location = f"{self.cdn_url}/cdn/{f.sha256}?file={quote(path)}&sig=fixture"
            self._reply(
                h,
                req,
                302,
                b"",
                {
                    **meta,
                    "Location": location,
                    "X-Linked-Etag": f'"{f.sha256}"',
                    "X-Linked-Size": str(len(f.content)),
                    "ETag": f'"{f.blob_id}"',
                },
            )
            return
        self._send_content(h, req, f, {**meta, "ETag": f'"{f.blob_id}"'})

    def _cdn_get(self, h, req: Request) -> None:
        time.sleep(self.cdn_delay_s)
        sha = req.path.rsplit("/", 1)[-1]
        for repo in self.repos.values():
            for commit in repo.refs.values():
                for f in commit.files.values():
                    if f.lfs and f.sha256 == sha:
                        self._send_content(h, req, f, {"ETag": f'"{sha}"'})
                        return
        self._reply(h, req, 404, b"no such object")

    def _send_content(self, h, req: Request, f: File, headers: dict) -> None:
        """The file's bytes, honouring `Range: bytes=N-`, with the faults switched on for it."""
        content = f.content
        if req.method == "GET":
            with self._lock:
                corrupt = f.path in self.faults.corrupt_always or f.path in self.faults.corrupt_once
                self.faults.corrupt_once.discard(f.path)
                cut = self.faults.cut_at.get(f.path)
                if cut is None and f.path in self.faults.cut_once:
                    self.faults.cut_once.discard(f.path)
                    cut = len(content) // 2
            if corrupt:
                mid = len(content) // 2
                content = content[:mid] + bytes([content[mid] ^ 0xFF]) + content[mid + 1 :]
        else:
            cut = None
        start, status, extra = 0, 200, {"Accept-Ranges": "bytes"}
        rng = req.headers.get("range", "")
        if rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes=") : -1])
            if start >= len(content):
                self._reply(h, req, 416, b"", {"Content-Range": f"bytes */{len(content)}"})
                return
            status = 206
            extra["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
        body = content[start:]
        if cut is None or not (start <= cut < len(content)) or req.method == "HEAD":
            self._reply(h, req, status, body, {**headers, **extra})
            return
        # Announce the whole body, send part of it, hang up.
        h.send_response(status)
        h.send_header("Content-Length", str(len(body)))
        for k, v in {**headers, **extra}.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body[: cut - start])
        h.wfile.flush()
        h.close_connection = True
        h.connection.shutdown(socket.SHUT_RDWR)
