// Helpers every communicator shares, built on the interface alone, and the
// MPI stand-ins when libra is built without MPI.
#include "libra/comm.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace libra {

Status exchange(Communicator& comm, const AllToAllV& x) {
  LIBRA_ASSIGN_OR_RETURN(PendingExchange p, comm.post(x));
  return comm.wait(p);
}

Result<std::vector<std::uint64_t>> allgather_by_exchange(Communicator& comm, std::uint64_t value) {
  const auto W = static_cast<std::size_t>(comm.size());
  std::vector<std::uint64_t> send(W, value), out(W, 0);
  std::vector<std::int64_t> counts(W, 8), displs(W);
  for (std::size_t p = 0; p < W; ++p) displs[p] = static_cast<std::int64_t>(8 * p);
  LIBRA_TRY(exchange(comm, {std::as_bytes(std::span<const std::uint64_t>(send)), counts, displs,
                            std::as_writable_bytes(std::span<std::uint64_t>(out)), counts, displs}));
  return out;
}

namespace {

// Every rank's string to `root`, or to every rank when there is no root:
// one all-to-all-v after the sizes are known everywhere.
Result<std::vector<std::string>> collect_strings(Communicator& comm, const std::string& mine, std::optional<int> root) {
  const auto W = static_cast<std::size_t>(comm.size());
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::uint64_t> sizes, comm.allgather(mine.size()));
  const auto n = static_cast<std::int64_t>(mine.size());
  const bool receives = !root || comm.rank() == *root;
  std::vector<std::int64_t> send_counts(W, root ? 0 : n), send_displs(W, 0), recv_counts(W, 0), recv_displs(W, 0);
  if (root) send_counts[static_cast<std::size_t>(*root)] = n;
  std::int64_t total = 0;
  if (receives) {
    for (std::size_t p = 0; p < W; ++p) {
      recv_counts[p] = static_cast<std::int64_t>(sizes[p]);
      recv_displs[p] = total;
      total += recv_counts[p];
    }
  }
  std::vector<std::byte> recv(static_cast<std::size_t>(total));
  LIBRA_TRY(exchange(comm, {std::as_bytes(std::span<const char>(mine)), send_counts, send_displs, recv, recv_counts,
                            recv_displs}));
  std::vector<std::string> out;
  if (!receives) return out;
  out.resize(W);
  for (std::size_t p = 0; p < W; ++p) {
    out[p].assign(reinterpret_cast<const char*>(recv.data()) + recv_displs[p], static_cast<std::size_t>(recv_counts[p]));
  }
  return out;
}

}  // namespace

Result<Agreement> agree(const AgreeTransport& transport, std::vector<std::int64_t> words, const std::string& problem) {
  words.push_back(static_cast<std::int64_t>(problem.size()));
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::vector<std::int64_t>> all, transport.gather_words(words));
  Agreement a;
  a.problems.resize(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() != words.size()) {
      return internal_error(fmt::format("agreement: rank {} sent {} words, expected {}", r, all[r].size(), words.size()));
    }
    if (all[r].back() != 0) a.failed.push_back(static_cast<int>(r));
    all[r].pop_back();
  }
  a.words = std::move(all);
  if (a.failed.empty()) return a;
  // Every rank takes this branch (they all saw the same lengths), so the
  // problems can be exchanged.
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::string> texts, transport.gather_bytes(problem));
  if (texts.size() != a.problems.size()) return internal_error("agreement: the byte gather lost ranks");
  a.problems = std::move(texts);
  return a;
}

namespace {

// agree() over a Communicator.
AgreeTransport transport_of(Communicator& comm) {
  return {[&comm](const std::vector<std::int64_t>& mine) -> Result<std::vector<std::vector<std::int64_t>>> {
            std::vector<std::vector<std::int64_t>> all(static_cast<std::size_t>(comm.size()));
            for (std::int64_t w : mine) {
              LIBRA_ASSIGN_OR_RETURN(std::vector<std::uint64_t> got, comm.allgather(static_cast<std::uint64_t>(w)));
              for (std::size_t r = 0; r < all.size(); ++r) all[r].push_back(static_cast<std::int64_t>(got[r]));
            }
            return all;
          },
          [&comm](const std::string& mine) { return collect_strings(comm, mine, std::nullopt); }};
}

}  // namespace

Status agree_on_status(Communicator& comm, const Status& local, const std::string& what) {
  const AgreeTransport t = transport_of(comm);
  // A problem travels as its error code's digit and its message, so every
  // rank returns the first failed rank's code too.
  const std::string mine = local.ok() ? std::string() : std::string(1, static_cast<char>('0' + static_cast<int>(local.error().code()))) + local.message();
  LIBRA_ASSIGN_OR_RETURN(Agreement a, agree(t, {}, mine));
  const std::vector<int>& failed = a.failed;
  if (failed.empty()) return Status();
  // All ranks return the same error, built from the gathered problems only,
  // and one line is printed for the job however many ranks failed.
  const std::string& first = a.problems[static_cast<std::size_t>(failed.front())];
  const auto code = static_cast<ErrorCode>(first.empty() ? static_cast<int>(ErrorCode::kInternal) : first[0] - '0');
  const std::string msg = first.empty() ? std::string("unknown failure") : first.substr(1);
  bool same = true;
  for (int r : failed) same = same && a.problems[static_cast<std::size_t>(r)] == first;
  const std::size_t W = a.problems.size();
  if (same && failed.size() == W) return Error(code, msg);
  if (same) return Error(code, fmt::format("{} (rank(s) {} of {})", msg, fmt::join(failed, ","), W));
  std::vector<int> rest(failed.begin() + 1, failed.end());
  return Error(code, fmt::format("{} (rank {} of {}; {} also failed on rank(s) {})", msg, failed.front(), W, what,
                                 fmt::join(rest, ",")));
}

Result<std::vector<std::string>> gather_strings(Communicator& comm, int root, const std::string& mine) {
  return collect_strings(comm, mine, root);
}

Status agree_on_value(Communicator& comm, std::uint64_t value, const std::string& what, const std::string& hint,
                      ErrorCode code) {
  LIBRA_ASSIGN_OR_RETURN(Agreement a, agree(transport_of(comm), {static_cast<std::int64_t>(value)}, std::string()));
  const std::size_t W = a.words.size();
  std::vector<std::pair<std::uint64_t, std::vector<int>>> groups;
  for (std::size_t r = 0; r < W; ++r) {
    const auto v = static_cast<std::uint64_t>(a.words[r][0]);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
    if (it == groups.end()) it = groups.insert(groups.end(), {v, {}});
    it->second.push_back(static_cast<int>(r));
  }
  if (groups.size() == 1) return Status();
  // Same text on every rank: built from the gathered values only.
  std::vector<std::string> parts;
  for (const auto& [v, ranks] : groups) parts.push_back(fmt::format("rank(s) {} hold {:016x}", fmt::join(ranks, ","), v));
  return Error(code, fmt::format("{} across the {} ranks: {}; {}", what, W, fmt::join(parts, "; "), hint));
}

Status agree_on_fingerprint(Communicator& comm, std::uint64_t fingerprint, const std::string& what) {
  return agree_on_value(comm, fingerprint, what + " fingerprint mismatch", "every rank must build or load the same " + what,
                        ErrorCode::kMismatch);
}

std::uint64_t fingerprint_of(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

bool mpi_launched() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

int mpi_launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    if (const char* r = std::getenv(var)) return std::atoi(r);
  }
  return -1;
}

#ifndef LIBRA_HAVE_MPI

bool mpi_built() { return false; }
Status mpi_init() { return invalid_input("MPI: libra was built without MPI (configure with -DLIBRA_WITH_MPI=ON and OpenMPI)"); }
void mpi_finalize() {}
Result<std::unique_ptr<Communicator>> mpi_world(double) { return mpi_init().error(); }

#endif

}  // namespace libra
