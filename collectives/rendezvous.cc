#include "collectives/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "runtime/core/error.h"

namespace fsdp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x46534450;  // "FSDP"
constexpr uint32_t kVersion = 1;
constexpr auto kRetryPause = std::chrono::milliseconds(100);

enum Status : uint32_t { kOk = 0, kWrongSize = 1, kBadRank = 2, kDuplicateRank = 3 };

// Closes a socket when it goes out of scope.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? int(std::min<int64_t>(left.count(), 1 << 30)) : 0;
}

// Waits until `fd` is readable (events = POLLIN) or writable (POLLOUT), or the deadline.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

bool send_all(int fd, const void* data, size_t len, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    if (!wait_for(fd, POLLOUT, deadline)) return false;
    const ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= size_t(n);
  }
  return true;
}

bool recv_all(int fd, void* data, size_t len, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    if (!wait_for(fd, POLLIN, deadline)) return false;
    const ssize_t n = ::recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= size_t(n);
  }
  return true;
}

bool send_u32s(int fd, std::initializer_list<uint32_t> values, Clock::time_point deadline) {
  std::vector<uint32_t> wire;
  for (uint32_t v : values) wire.push_back(htonl(v));
  return send_all(fd, wire.data(), wire.size() * 4, deadline);
}

bool recv_u32s(int fd, uint32_t* out, size_t n, Clock::time_point deadline) {
  if (!recv_all(fd, out, n * 4, deadline)) return false;
  for (size_t i = 0; i < n; ++i) out[i] = ntohl(out[i]);
  return true;
}

std::string seconds(std::chrono::milliseconds ms) {
  return str_cat(std::chrono::duration<double>(ms).count(), " s");
}

// ---- TCP, rank 0: accept size-1 ranks and hand each the payload.
std::string serve(int port, int size, const std::string& payload,
                  std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  Socket listener(::socket(AF_INET, SOCK_STREAM, 0));
  FSDP_CHECK(listener.fd() >= 0, LaunchError, "rendezvous: socket() failed: ", std::strerror(errno));
  const int yes = 1;
  ::setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(uint16_t(port));
  FSDP_CHECK(::bind(listener.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0,
             LaunchError, "rendezvous: rank 0 cannot listen on MASTER_PORT=", port, ": ",
             std::strerror(errno), " (is another job using it?)");
  FSDP_CHECK(::listen(listener.fd(), size) == 0, LaunchError, "rendezvous: listen() on port ",
             port, " failed: ", std::strerror(errno));

  std::set<uint32_t> served;
  while (served.size() + 1 < size_t(size)) {
    FSDP_CHECK(wait_for(listener.fd(), POLLIN, deadline), TimeoutError, "rendezvous: rank 0 ",
               "waited ", seconds(timeout), " on MASTER_PORT=", port, " but only ",
               served.size(), " of the ", size - 1, " other ranks connected");
    Socket peer(::accept(listener.fd(), nullptr, nullptr));
    if (peer.fd() < 0) continue;  // the connection went away before it was accepted
    // A peer that connects but says nothing is given a few seconds, not the whole timeout.
    const Clock::time_point peer_deadline =
        std::min(deadline, Clock::now() + std::chrono::seconds(10));
    uint32_t hello[4];
    if (!recv_u32s(peer.fd(), hello, 4, peer_deadline) || hello[0] != kMagic ||
        hello[1] != kVersion) {
      continue;  // not one of ours (a port scanner, a stale client): ignore it
    }
    const uint32_t rank = hello[2], their_size = hello[3];
    Status status = kOk;
    if (their_size != uint32_t(size)) status = kWrongSize;
    else if (rank == 0 || rank >= uint32_t(size)) status = kBadRank;
    else if (served.count(rank)) status = kDuplicateRank;
    if (status != kOk) {
      send_u32s(peer.fd(), {status, 0}, peer_deadline);
      FSDP_THROW(LaunchError, "rendezvous on MASTER_PORT=", port, ": a process claiming rank ",
                 rank, " of ", their_size, " connected, but this job has ", size, " ranks",
                 status == kDuplicateRank ? " and that rank already connected" : "",
                 ": check RANK/WORLD_SIZE of every process");
    }
    if (send_u32s(peer.fd(), {kOk, uint32_t(payload.size())}, peer_deadline) &&
        send_all(peer.fd(), payload.data(), payload.size(), peer_deadline)) {
      served.insert(rank);
    }
  }
  return payload;
}

// ---- TCP, other ranks: connect (retrying) and receive the payload.
std::string fetch(const std::string& host, int port, int rank, int size,
                  std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  const std::string where = str_cat("MASTER_ADDR=", host, " MASTER_PORT=", port);
  std::string last_error = "no attempt";
  while (Clock::now() < deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (gai != 0) {
      last_error = str_cat("cannot resolve ", host, ": ", ::gai_strerror(gai));
      std::this_thread::sleep_for(kRetryPause);
      continue;
    }
    for (addrinfo* a = found; a; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (s.fd() < 0) continue;
      if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0) {
        last_error = std::strerror(errno);
        continue;
      }
      uint32_t reply[2];
      if (!send_u32s(s.fd(), {kMagic, kVersion, uint32_t(rank), uint32_t(size)}, deadline) ||
          !recv_u32s(s.fd(), reply, 2, deadline)) {
        last_error = "the connection closed during the handshake";
        continue;
      }
      ::freeaddrinfo(found);
      found = nullptr;
      FSDP_CHECK(reply[0] == kOk, LaunchError, "rendezvous at ", where, ": rank 0 refused rank ",
                 rank, " of ", size, reply[0] == kWrongSize ? " (its world size differs)"
                 : reply[0] == kDuplicateRank ? " (another process already claimed this rank)"
                                             : " (not a valid rank)",
                 ": check RANK/WORLD_SIZE of every process");
      FSDP_CHECK(reply[1] <= kMaxRendezvousPayload, LaunchError, "rendezvous at ", where,
                 ": rank 0 announced a payload of ", reply[1], " bytes (not one of ours?)");
      std::string payload(reply[1], '\0');
      FSDP_CHECK(recv_all(s.fd(), &payload[0], payload.size(), deadline), LaunchError,
                 "rendezvous at ", where, ": the connection closed before the payload arrived");
      return payload;
    }
    if (found) ::freeaddrinfo(found);
    std::this_thread::sleep_for(kRetryPause);
  }
  FSDP_THROW(TimeoutError, "rendezvous: rank ", rank, " could not reach rank 0 at ", where,
             " within ", seconds(timeout), " (last error: ", last_error, ")");
}

}  // namespace

// ---- file

std::string format_rendezvous_record(const RendezvousRecord& record) {
  return str_cat("FSDP-RENDEZVOUS 1 ", record.size, " ", record.payload.size(), "\n") + record.payload;
}

std::optional<RendezvousRecord> parse_rendezvous_record(const std::string& contents) {
  const size_t eol = contents.find('\n');
  if (eol == std::string::npos || eol > 64) return std::nullopt;
  std::istringstream fields(contents.substr(0, eol));
  std::string magic, rest;
  long long version = 0, size = 0, bytes = -1;
  if (!(fields >> magic >> version >> size >> bytes) || (fields >> rest)) return std::nullopt;
  if (magic != "FSDP-RENDEZVOUS" || version != 1 || size < 1 || size > (1LL << 24) || bytes < 0 ||
      size_t(bytes) > kMaxRendezvousPayload || contents.size() - eol - 1 != size_t(bytes))
    return std::nullopt;
  RendezvousRecord record{int(size), contents.substr(eol + 1)};
  // Only the header rank 0 writes, byte for byte (no signs, leading zeros or extra spaces).
  if (format_rendezvous_record(record).compare(0, eol + 1, contents, 0, eol + 1) != 0) return std::nullopt;
  return record;
}

std::string tcp_rendezvous(const std::string& host, int port, int rank, int size,
                           const std::string& payload, std::chrono::milliseconds timeout) {
  FSDP_CHECK(size >= 1 && rank >= 0 && rank < size, LaunchError, "rendezvous: rank ", rank,
             " of ", size);
  FSDP_CHECK(port > 0 && port < 65536, LaunchError, "rendezvous: MASTER_PORT=", port,
             " is not a TCP port");
  if (size == 1) return payload;
  if (rank == 0) return serve(port, size, payload, timeout);
  return fetch(host, port, rank, size, timeout);
}

std::string file_rendezvous(const std::string& path, int rank, int size,
                            const std::string& payload, std::chrono::milliseconds timeout) {
  FSDP_CHECK(size >= 1 && rank >= 0 && rank < size, LaunchError, "rendezvous: rank ", rank,
             " of ", size);
  FSDP_CHECK(!path.empty(), LaunchError, "rendezvous: FSDP_RENDEZVOUS_FILE is empty");
  if (size == 1) return payload;
  if (rank == 0) {
    // Write elsewhere, then rename: readers never see a half-written file.
    const std::string temp = str_cat(path, ".tmp.", ::getpid());
    {
      std::ofstream out(temp, std::ios::binary | std::ios::trunc);
      FSDP_CHECK(out.good(), IoError, "rendezvous: cannot write FSDP_RENDEZVOUS_FILE=", path,
                 " (via ", temp, ")");
      out << format_rendezvous_record({size, payload});
      FSDP_CHECK(out.good(), IoError, "rendezvous: writing ", temp, " failed");
    }
    FSDP_CHECK(std::rename(temp.c_str(), path.c_str()) == 0, IoError, "rendezvous: cannot ",
               "rename ", temp, " to FSDP_RENDEZVOUS_FILE=", path, ": ", std::strerror(errno));
    return payload;
  }
  const Clock::time_point deadline = Clock::now() + timeout;
  // Files written before (now - timeout) belong to an earlier job.
  const time_t oldest = ::time(nullptr) - time_t(std::chrono::duration_cast<std::chrono::seconds>(timeout).count()) - 1;
  std::string seen = "no file";
  while (Clock::now() < deadline) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      if (st.st_mtime < oldest) {
        seen = "only a stale file from an earlier job";
      } else if (uint64_t(st.st_size) <= kMaxRendezvousPayload + 64) {
        std::ifstream in(path, std::ios::binary);
        const std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (const std::optional<RendezvousRecord> record = parse_rendezvous_record(contents)) {
          FSDP_CHECK(record->size == size, LaunchError, "rendezvous: FSDP_RENDEZVOUS_FILE=", path,
                     " was written by a job of ", record->size, " ranks, but this one has ", size);
          return record->payload;
        }
        seen = "a file that is not a complete rendezvous record";
      } else {
        seen = "a file too large to be a rendezvous record";
      }
    }
    std::this_thread::sleep_for(kRetryPause / 2);
  }
  FSDP_THROW(TimeoutError, "rendezvous: rank ", rank, " found ", seen,
             " at FSDP_RENDEZVOUS_FILE=", path, " within ", seconds(timeout),
             " (rank 0 writes it)");
}

void remove_rendezvous_file(const std::string& path) {
  if (!path.empty()) std::remove(path.c_str());
}

}  // namespace fsdp
