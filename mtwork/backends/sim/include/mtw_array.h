// metal::array and metal::uniform.
#pragma once

#include "mtw_base.h"

namespace metal {

// A fixed-size array (MSL specification, "Arrays of Textures, Texture Buffers, and
// Samplers": array<T, N> with operator[] and size(), for any element type). An aggregate,
// so `array<T, 2> a = {x, y};` works, laid out as T[N].
template <typename T, size_t N>
struct array {
  static_assert(N > 0, "metal::array needs at least one element");
  T __elements[N];

  static constexpr size_t size() { return N; }
  MTW_INLINE constexpr T& operator[](size_t i) { return __elements[i]; }
  MTW_INLINE constexpr const T& operator[](size_t i) const { return __elements[i]; }
  MTW_INLINE constexpr T* begin() { return __elements; }
  MTW_INLINE constexpr const T* begin() const { return __elements; }
  MTW_INLINE constexpr T* end() { return __elements + N; }
  MTW_INLINE constexpr const T* end() const { return __elements + N; }
};

// A value the same for every thread (MSL specification, "Uniform Type"). It converts
// implicitly to T, so mixing it with ordinary values gives ordinary values; operations
// among uniform values give uniform values; an ordinary value becomes uniform only through
// make_uniform (assigning one to a uniform is a compile error, as on Metal). The
// emulator does not check that the value really is the same in every thread.
template <typename T>
struct uniform {
  uniform() = default;
  template <typename U, typename = enable_if_t<!is_same_v<U, T> && is_convertible_v<U, T>>>
  constexpr MTW_INLINE uniform(uniform<U> u) : __value(T(U(u))) {}
  constexpr MTW_INLINE operator T() const { return __value; }

  template <typename U>
  MTW_INLINE uniform& operator+=(uniform<U> u) { return *this = *this + u; }
  template <typename U>
  MTW_INLINE uniform& operator-=(uniform<U> u) { return *this = *this - u; }
  template <typename U>
  MTW_INLINE uniform& operator*=(uniform<U> u) { return *this = *this * u; }
  template <typename U>
  MTW_INLINE uniform& operator/=(uniform<U> u) { return *this = *this / u; }
  MTW_INLINE uniform& operator++() { ++__value; return *this; }
  MTW_INLINE uniform& operator--() { --__value; return *this; }
  MTW_INLINE uniform operator++(int) { uniform old = *this; ++__value; return old; }
  MTW_INLINE uniform operator--(int) { uniform old = *this; --__value; return old; }

  T __value;
};

template <typename T>
constexpr MTW_INLINE uniform<T> make_uniform(T value) {
  uniform<T> u;
  u.__value = value;
  return u;
}

#define MTW_UNIFORM_BINARY(op)                                                  \
  template <typename A, typename B>                                            \
  constexpr MTW_INLINE auto operator op(uniform<A> a, uniform<B> b) {          \
    return make_uniform(A(a) op B(b));                                         \
  }
MTW_UNIFORM_BINARY(+)
MTW_UNIFORM_BINARY(-)
MTW_UNIFORM_BINARY(*)
MTW_UNIFORM_BINARY(/)
MTW_UNIFORM_BINARY(%)
MTW_UNIFORM_BINARY(&)
MTW_UNIFORM_BINARY(|)
MTW_UNIFORM_BINARY(^)
MTW_UNIFORM_BINARY(<<)
MTW_UNIFORM_BINARY(>>)
MTW_UNIFORM_BINARY(&&)
MTW_UNIFORM_BINARY(||)
MTW_UNIFORM_BINARY(==)
MTW_UNIFORM_BINARY(!=)
MTW_UNIFORM_BINARY(<)
MTW_UNIFORM_BINARY(<=)
MTW_UNIFORM_BINARY(>)
MTW_UNIFORM_BINARY(>=)
#undef MTW_UNIFORM_BINARY
#define MTW_UNIFORM_UNARY(op)                                                    \
  template <typename A>                                                         \
  constexpr MTW_INLINE auto operator op(uniform<A> a) { return make_uniform(op A(a)); }
MTW_UNIFORM_UNARY(-)
MTW_UNIFORM_UNARY(+)
MTW_UNIFORM_UNARY(~)
MTW_UNIFORM_UNARY(!)
#undef MTW_UNIFORM_UNARY

}  // namespace metal
