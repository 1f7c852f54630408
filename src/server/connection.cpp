#include "server/connection.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "common/errors.h"

namespace torchtpu::server {
namespace {

bool address_is(const sockaddr_storage& addr, socklen_t len, const std::string& host, int port) {
  char name[NI_MAXHOST];
  char service[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, name, sizeof(name), service,
                  sizeof(service), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  return host == name && port == std::atoi(service);
}

}  // namespace

int find_connection_socket(const std::string& local_addr, int local_port,
                           const std::string& remote_addr, int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_len = sizeof(peer), local_len = sizeof(local);
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
        getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) {
      continue;
    }
    if (address_is(peer, peer_len, remote_addr, remote_port) &&
        address_is(local, local_len, local_addr, local_port)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void check_port(int port) {
  if (port < 0 || port > 65535) {
    throw ValueError("--port must be between 0 (any free port) and 65535, got " +
                     std::to_string(port));
  }
}

int bind_listener(httplib::Server& http, const std::string& host, int port) {
  // httplib hands every socket it creates for the listener to the socket options, the last one
  // being the one bound. Its default sets SO_REUSEPORT, which lets a second server bind a port
  // that one already listens on (the kernel then shares the connections between them); only
  // SO_REUSEADDR is set, so a port in use is refused and a restart may still bind a port whose old
  // connections linger in TIME_WAIT.
  int listening = -1;
  http.set_socket_options([&listening](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listening = sock;
  });
  int bound = -1;
  if (port == 0) {
    bound = http.bind_to_any_port(host);
  } else if (http.bind_to_port(host, port)) {
    bound = port;
  }
  http.set_socket_options(httplib::default_socket_options);
  if (bound <= 0 || ::listen(listening, kListenBacklog) != 0) return -1;
  return bound;
}

}  // namespace torchtpu::server
