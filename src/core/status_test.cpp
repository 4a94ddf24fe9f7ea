#include "libra/status.hpp"

#include <gtest/gtest.h>

namespace libra {
namespace {

TEST(Error, MessagesArePrintableAsciiWhateverTheInputHeld) {
  EXPECT_EQ(invalid_input("a\nb.txt: cannot open").message(), "a\\x0ab.txt: cannot open");
  EXPECT_EQ(io_error("\x1b[31mred").message(), "\\x1b[31mred");
  EXPECT_EQ(invalid_input("caf\xc3\xa9 \x7f").message(), "caf\\xc3\\xa9 \\x7f");
  EXPECT_EQ(invalid_input("plain: 'ok' \\ stays").message(), "plain: 'ok' \\ stays");
}

}  // namespace
}  // namespace libra
