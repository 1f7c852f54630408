// Whether the client of a request is still there. cpp-httplib 0.11 (Debian 12) gives handlers no
// handle on the connection, so the socket is found by its addresses: the open socket whose local
// and peer address and port are the request's. A TCP connection's four values are unique among live
// sockets, and the socket stays open until the handler and its content provider return, so the
// descriptor found remains this connection's for as long as the request is served.
#pragma once

#include <string>

namespace torchtpu::server {

// The descriptor of the connection local_addr:local_port <-> remote_addr:remote_port (numeric
// addresses as cpp-httplib writes them), or -1 if none is open.
int find_connection_socket(const std::string& local_addr, int local_port,
                           const std::string& remote_addr, int remote_port);

// True once the peer has closed or reset the connection (poll + recv(MSG_PEEK), as newer
// cpp-httplib does for Request::is_connection_closed). Never blocks; false for fd < 0.
bool peer_closed(int fd);

}  // namespace torchtpu::server
