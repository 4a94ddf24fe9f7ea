// python/src/binding.cpp: the helpers every stage of the binding shares
// (binding.hpp): errors to Python exceptions, int64 arrays and tables, input
// checks.
#include "binding.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace libra_py {
namespace {

// The core's messages name CLI flags (`--pool-size 2: must divide --gbs 3`); from Python they name
// the Python arguments (`pool_size 2: must divide gbs 3`). Translated here, once, for every call.
std::string python_names(const std::string& m) {
  std::string out;
  out.reserve(m.size());
  for (std::size_t i = 0; i < m.size();) {
    // A flag starts the message or follows a space, bracket or quote; `--` inside a path stays.
    const bool at_word = i == 0 || (m[i - 1] != '\0' && std::strchr(" ([`'\"", m[i - 1]) != nullptr);
    if (at_word && m.compare(i, 2, "--") == 0 && i + 2 < m.size() && std::islower(static_cast<unsigned char>(m[i + 2]))) {
      std::size_t j = i + 2;
      while (j < m.size() && (std::islower(static_cast<unsigned char>(m[j])) || std::isdigit(static_cast<unsigned char>(m[j])) || m[j] == '-')) ++j;
      std::string name = m.substr(i + 2, j - i - 2);
      if (name == "block") name = "block_size";  // `libra plan --block` is make_plan's block_size
      std::replace(name.begin(), name.end(), '-', '_');
      out += name;
      i = j;
    } else {
      out += m[i++];
    }
  }
  return out;
}

}  // namespace

[[noreturn]] void raise(const libra::Error& e) {
  PyObject* type = PyExc_ValueError;
  if (e.code() == libra::ErrorCode::kIo) type = PyExc_OSError;
  if (e.code() == libra::ErrorCode::kInternal) type = PyExc_RuntimeError;
  PyErr_SetString(type, python_names(e.message()).c_str());
  throw py::error_already_set();
}

void check(const libra::Status& s) {
  if (!s.ok()) raise(s.error());
}

[[noreturn]] void bad(const std::string& message) { throw py::value_error(message); }

py::array_t<I64> int_array(std::vector<I64> values, I64 cols) {
  auto* owned = new std::vector<I64>(std::move(values));
  py::capsule free_it(owned, [](void* p) { delete static_cast<std::vector<I64>*>(p); });
  std::vector<py::ssize_t> shape, strides;
  const auto n = static_cast<py::ssize_t>(owned->size());
  if (cols > 0) {
    shape = {n / cols, static_cast<py::ssize_t>(cols)};
    strides = {static_cast<py::ssize_t>(cols * 8), 8};
  } else {
    shape = {n};
    strides = {8};
  }
  py::array_t<I64> a(shape, strides, owned->data(), free_it);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

py::dict table(Columns cols) {
  py::dict d;
  for (auto& [name, values] : cols) d[name] = int_array(std::move(values));
  return d;
}

std::vector<libra::PackedSequence> to_sequences(const py::handle& obj, const char* what) {
  std::vector<libra::PackedSequence> out;
  try {
    out = obj.cast<std::vector<libra::PackedSequence>>();
  } catch (const py::cast_error&) {
    bad(std::string(what) + ": must be a list of packed sequences (lists of positive integer sample lengths)");
  }
  // pybind11 reads True as 1: a bool among the lengths is a caller's bug, not a sample of one token.
  std::size_t i = 0;
  for (py::handle seq : obj) {
    std::size_t j = 0;
    for (py::handle x : seq) {
      if (PyBool_Check(x.ptr())) {
        bad(std::string(what) + "[" + std::to_string(i) + "][" + std::to_string(j) + "] " +
            std::string(py::str(x)) + ": is a bool, not a sample length");
      }
      ++j;
    }
    ++i;
  }
  return out;
}

void check_worker(const libra::Plan& p, int r, const char* what) {
  if (r < 0 || r >= p.num_workers()) {
    bad(std::string(what) + " " + std::to_string(r) + ": must be in [0, " + std::to_string(p.num_workers()) + ")");
  }
}

}  // namespace libra_py
