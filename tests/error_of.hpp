// What a test reads of an error: the message of the mpopt::error a callable throws.
#pragma once

#include <exception>
#include <string>

#include <mpopt/error.hpp>

/// The message of the mpopt::error `f` throws; a marker without the "mpopt: " prefix otherwise.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const mpopt::error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not an mpopt::error: ") + e.what() + ">";
  } catch (...) {
    return "<not an mpopt::error>";
  }
  return "<no exception>";
}
