// The executors' trace: a recorder per rank and the one Chrome trace-event
// file of a job (libra/executor.hpp).
#include <fmt/format.h>

#include <algorithm>

#include "libra/executor.hpp"
#include "libra/io.hpp"

namespace libra {

// The default origin is the steady clock's epoch (CLOCK_MONOTONIC on Linux),
// shared by every process of one machine, so the ranks' events line up.
TraceRecorder::TraceRecorder() : origin_() {}
TraceRecorder::TraceRecorder(std::chrono::steady_clock::time_point origin) : origin_(origin) {}

double TraceRecorder::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
}

void TraceRecorder::record(const std::string& name, Lane lane, double begin_us, double end_us) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({name, lane, begin_us, std::max(end_us, begin_us)});
}

std::vector<TraceRecorder::Event> TraceRecorder::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

std::string TraceRecorder::json_events(int rank) const {
  static const char* kLaneNames[] = {"compute", "transfer", "wait"};
  std::string out;
  auto add = [&](const std::string& s) {
    if (!out.empty()) out += ",\n";
    out += s;
  };
  add(fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":"rank {}"}}}})", rank, rank));
  for (int lane = 0; lane < 3; ++lane) {
    add(fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":"{}"}}}})", rank, lane,
                    kLaneNames[lane]));
  }
  for (const Event& e : events()) {
    add(fmt::format(R"({{"name":"{}","cat":"{}","ph":"X","pid":{},"tid":{},"ts":{:.1f},"dur":{:.1f}}})", e.name,
                    kLaneNames[e.lane], rank, static_cast<int>(e.lane), e.begin_us, e.end_us - e.begin_us));
  }
  return out;
}

std::string trace_document(const std::vector<std::string>& rank_events) {
  std::string text = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  for (std::size_t i = 0; i < rank_events.size(); ++i) {
    if (i > 0) text += ",\n";
    text += rank_events[i];
  }
  text += "\n]}\n";
  return text;
}

Status write_trace(Communicator& comm, const TraceRecorder& trace, const std::string& path) {
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::string> all,
                         gather_strings(comm, 0, trace.json_events(comm.rank())));
  Status st;
  if (comm.rank() == 0) st = write_file_atomic(path, trace_document(all));
  return agree_on_status(comm, st, "--trace " + path);
}

}  // namespace libra
