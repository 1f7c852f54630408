#!/usr/bin/env bash
# Installs `torchtpu-cpp proxy` as a systemd user service (the chat page, /mcp and every /v1
# request forwarded to the server) and prints the MCP client configuration for the stdio server.
#
#   rig/demo/install.sh --upstream http://HOST:8000
#   rig/demo/install.sh --upstream-cmd 'gcloud compute tpus tpu-vm describe NAME --zone Z \
#       --format="value(networkEndpoints[0].accessConfig.externalIp)"'
#
# Options: --binary PATH (default: torchtpu-cpp on PATH, else build/torchtpu-cpp), --port N
# (default 8015), --name NAME (service and MCP server name, default torchtpu-cpp-demo),
# --dry-run (write nothing, print what would be written).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
binary=""
port=8015
name="torchtpu-cpp-demo"
upstream=""
upstream_cmd=""
dry_run=0

die() {
  echo "install.sh: $*" >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --upstream) upstream="$2"; shift 2 ;;
    --upstream-cmd) upstream_cmd="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

if [[ -n "$upstream" && -n "$upstream_cmd" ]] || [[ -z "$upstream" && -z "$upstream_cmd" ]]; then
  die "give exactly one of --upstream URL and --upstream-cmd CMD"
fi
[[ "$port" =~ ^[0-9]+$ ]] || die "--port must be a number, got '$port'"
# The name becomes a file name and a systemd unit name.
[[ "$name" =~ ^[A-Za-z0-9_.@-]+$ ]] || die "--name may hold only letters, digits and _ . @ -, got '$name'"
if [[ -z "$binary" ]]; then
  binary="$(command -v torchtpu-cpp || true)"
  [[ -n "$binary" ]] || binary="$here/../../build/torchtpu-cpp"
fi
[[ -x "$binary" ]] || die "no torchtpu-cpp binary at '$binary' (build it, or pass --binary)"
binary="$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")"
# systemd refuses to start an executable whose path holds these, however they are quoted.
[[ "$binary" != *[\'\"\\\$]* ]] ||
  die "systemd cannot start an executable whose path holds quotes, backslashes or \$: '$binary' (link it from a plainer path)"
# A line break would end the ExecStart line and start a directive of its own.
for value in "$binary" "$upstream" "$upstream_cmd"; do
  [[ "$value" != *[[:cntrl:]]* ]] || die "values may not hold control characters (line breaks, tabs): '$value'"
done

# systemd's ExecStart quoting: each argument in double quotes, with \ " $ % escaped.
quote() {
  local s="$1"
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  s="${s//\$/\$\$}"
  s="${s//%/%%}"
  printf '"%s"' "$s"
}

# A JSON string: \ and " escaped (control characters were refused above).
json() {
  local s="$1"
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  printf '"%s"' "$s"
}

exec_start="$(quote "$binary") proxy --host 127.0.0.1 --port $port"
if [[ -n "$upstream" ]]; then
  exec_start+=" --upstream $(quote "$upstream")"
else
  exec_start+=" --upstream-cmd $(quote "$upstream_cmd")"
fi

unit="[Unit]
Description=torchtpu-cpp proxy: chat page, MCP and /v1 on 127.0.0.1:$port

[Service]
ExecStart=$exec_start
Restart=on-failure
RestartSec=2

[Install]
WantedBy=default.target"

unit_dir="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
unit_file="$unit_dir/$name.service"
if [[ "$dry_run" == 1 ]]; then
  echo "# $unit_file"
  echo "$unit"
else
  mkdir -p "$unit_dir"
  printf '%s\n' "$unit" >"$unit_file"
  systemctl --user daemon-reload
  systemctl --user enable --now "$name.service"
  echo "installed $unit_file; chat page: http://127.0.0.1:$port/"
fi

# The stdio MCP server in the "mcpServers" shape most MCP clients read; the Streamable HTTP
# endpoint http://127.0.0.1:$port/mcp serves the same tools.
cat <<JSON

MCP client configuration (stdio):
{
  "mcpServers": {
    $(json "$name"): {
      "command": $(json "$binary"),
      "args": ["mcp", "--url", "http://127.0.0.1:$port"]
    }
  }
}
Streamable HTTP: http://127.0.0.1:$port/mcp
JSON
