// Metal's vector types on clang ext vectors.
//
// `vec<T, N>` wraps a clang ext-vector (which gives the arithmetic and swizzle code) in a
// class, because MSL spells construction `float4(a, b.xy, c)` and converts with
// `float4(int4)` elementwise: neither works on a bare ext-vector in C++. Components are
// real members (`v.x` is a T lvalue); multi-component swizzles are properties generated
// into metal_swizzles.inc. Sizes and alignments match Metal's (float3 is 16 bytes).
//
// Constructors (MSL specification, 2.2.2 "Vector Constructors"): a scalar fills every
// component; scalars and vectors whose components add up to N fill them in order
// (`float4(f2, 0, 1)`); `float4(int4)` converts each component. A braced list of at most
// N scalars (`uint4 ks = {a, b, c};`) fills the first components and zeroes the rest, as
// an aggregate does in C (clang's ext-vectors, which Metal's vectors are, behave so).
#pragma once

#include "metal_swizzles.inc"
#include "mtw_base.h"

namespace metal {

template <typename T>
struct __vec_storage_elem {
  using type = T;
};
// Metal's bool vectors have one byte per component; clang's ext-vector bool is a bit mask.
template <>
struct __vec_storage_elem<bool> {
  using type = unsigned char;
};
template <>
struct __vec_storage_elem<bfloat> {
  using type = __bf16;
};

template <typename T, int N>
struct vec;
template <typename T, int N>
struct packed_vec;

template <typename T>
struct __vec_traits {
  static constexpr bool is_vec = false;
  static constexpr int size = 1;
  using element = T;
};
template <typename T, int N>
struct __vec_traits<vec<T, N>> {
  static constexpr bool is_vec = true;
  static constexpr int size = N;
  using element = T;
};
template <typename T, int N>
struct __vec_traits<packed_vec<T, N>> {
  static constexpr bool is_vec = true;
  static constexpr int size = N;
  using element = T;
};
template <typename T>
constexpr bool __is_vec_v = __vec_traits<remove_cvref_t<T>>::is_vec;
template <typename T>
using __elem_t = typename __vec_traits<remove_cvref_t<T>>::element;

template <typename... A>
constexpr int __component_count() {
  return (0 + ... + __vec_traits<remove_cvref_t<A>>::size);
}

template <typename To, typename ToElement, int N, typename FromVec>
MTW_INLINE To __convert_storage(FromVec from);

template <int N, typename Mask>
MTW_INLINE vec<bool, N> __mask_to_bool(Mask m);

template <typename T>
constexpr int __bits = sizeof(T) * 8;

// A component as the ext-vector stores it (bfloat as its __bf16, bool as a byte).
template <typename T>
MTW_INLINE constexpr typename __vec_storage_elem<T>::type __storage_of(T x) {
  if constexpr (is_same_v<T, bfloat>) return x.__value;
  else return typename __vec_storage_elem<T>::type(x);
}
template <typename S>
constexpr bool __is_scalar_v = is_arithmetic_v<remove_cvref_t<S>>;

// A scalar operand of any arithmetic type, converted to the element type.
#define MTW_VEC_SCALAR template <typename S, enable_if_t<__is_scalar_v<S>, int> = 0>

// Storage `x op y`; bfloat vectors compute in float and round in the shim (see
// __mtw_round_bf16 in mtw_bfloat.h for why not with the compiler's conversion).
#define MTW_VEC_APPLY(x, op, y) __vec_apply([](auto p, auto q) { return p op q; }, x, y)
template <typename F, typename V>
MTW_INLINE V __vec_apply(F f, V x, V y) {
#ifdef MTW_PROFILE
  constexpr bool bfloat = false;  // profiled builds count clang's bfloat operations
#else
  constexpr bool bfloat = is_same_v<remove_cvref_t<decltype(x[0])>, __bf16>;
#endif
  if constexpr (bfloat) {
    constexpr int n = __builtin_vectorelements(V);
    typedef float wide __attribute__((ext_vector_type(n)));
    return __mtw_round_bf16<n>(f(__builtin_convertvector(x, wide),
                                 __builtin_convertvector(y, wide)));
  } else {
    return f(x, y);
  }
}

#define MTW_VEC_BINARY(op)                                                                 \
  friend MTW_INLINE vec operator op(vec a, vec b) {                                        \
    return from_storage(MTW_VEC_APPLY(a.v, op, b.v));                                      \
  }                                                                                        \
  MTW_VEC_SCALAR                                                                           \
  friend MTW_INLINE vec operator op(vec a, S b) {                                          \
    return from_storage(MTW_VEC_APPLY(a.v, op, splat(T(b))));                              \
  }                                                                                        \
  MTW_VEC_SCALAR                                                                           \
  friend MTW_INLINE vec operator op(S a, vec b) {                                          \
    return from_storage(MTW_VEC_APPLY(splat(T(a)), op, b.v));                              \
  }                                                                                        \
  MTW_INLINE vec& operator op##=(vec b) {                                                  \
    v = MTW_VEC_APPLY(v, op, b.v);                                                         \
    return *this;                                                                          \
  }                                                                                        \
  MTW_VEC_SCALAR                                                                           \
  MTW_INLINE vec& operator op##=(S b) {                                                    \
    v = MTW_VEC_APPLY(v, op, splat(T(b)));                                                 \
    return *this;                                                                          \
  }

// MSL masks shift counts to the width of the element type.
#define MTW_VEC_SHIFT(op)                                                                  \
  friend MTW_INLINE vec operator op(vec a, vec b) {                                        \
    return from_storage(a.v op(b.v & storage(__bits<T> - 1)));                             \
  }                                                                                        \
  MTW_VEC_SCALAR                                                                           \
  friend MTW_INLINE vec operator op(vec a, S b) { return a op vec(T(b)); }                 \
  MTW_VEC_SCALAR                                                                           \
  friend MTW_INLINE vec operator op(S a, vec b) { return vec(T(a)) op b; }                 \
  MTW_INLINE vec& operator op##=(vec b) { return *this = *this op b; }                     \
  MTW_VEC_SCALAR                                                                           \
  MTW_INLINE vec& operator op##=(S b) { return *this = *this op vec(T(b)); }

#define MTW_VEC_COMPARE(op, N)                                                             \
  friend MTW_INLINE vec<bool, N> operator op(vec a, vec b) {                               \
    return __mask_to_bool<N>(a.v op b.v);                                                  \
  }                                                                                        \
  MTW_VEC_SCALAR                                                                           \
  friend MTW_INLINE vec<bool, N> operator op(vec a, S b) { return a op vec(T(b)); }        \
  MTW_VEC_SCALAR                                                                           \
  friend MTW_INLINE vec<bool, N> operator op(S a, vec b) { return vec(T(a)) op b; }

#define MTW_VEC_COMMON(N)                                                                  \
  using value_type = T;                                                                    \
  typedef typename __vec_storage_elem<T>::type storage_element;                            \
  typedef storage_element storage __attribute__((ext_vector_type(N)));                     \
  vec() = default;                                                                         \
  constexpr MTW_INLINE vec(T s) : v(splat(s)) {}                                           \
  /* Other scalars: implicit where they convert implicitly to T (bfloat takes floats only  \
     explicitly). */                                                                       \
  template <typename S, enable_if_t<__is_scalar_v<S> && !is_same_v<S, T> &&                \
                                        is_convertible_v<S, T>, int> = 0>                  \
  constexpr MTW_INLINE vec(S s) : vec(T(s)) {}                                             \
  template <typename S,                                                                    \
            enable_if_t<__is_scalar_v<S> && !is_convertible_v<S, T>, int> = 0>             \
  explicit constexpr MTW_INLINE vec(S s) : vec(T(s)) {}                                    \
  MTW_INLINE vec(std::initializer_list<T> list) : v(0) {                                   \
    int i = 0;                                                                             \
    for (const T& x : list)                                                                \
      if (i < N) v[i++] = __storage_of(x);                                                 \
  }                                                                                        \
  template <typename A0, typename A1, typename... As,                                      \
            typename = enable_if_t<__component_count<A0, A1, As...>() == N>>               \
  MTW_INLINE vec(A0 a0, A1 a1, As... as) {                                                 \
    storage tmp;                                                                           \
    int i = 0;                                                                             \
    __fill(tmp, i, a0);                                                                    \
    __fill(tmp, i, a1);                                                                    \
    (__fill(tmp, i, as), ...);                                                             \
    v = tmp;                                                                               \
  }                                                                                        \
  template <typename U>                                                                    \
  explicit MTW_INLINE vec(vec<U, N> other) : v(__convert_storage<storage, T, N>(other.v)) {} \
  MTW_INLINE vec(packed_vec<T, N> p);                                                      \
  template <typename U, typename = enable_if_t<!is_same_v<U, T>>>                          \
  explicit MTW_INLINE vec(packed_vec<U, N> p) : vec(vec<U, N>(p)) {}                       \
  static constexpr MTW_INLINE storage splat(T s) { return (storage)__storage_of(s); }      \
  static MTW_INLINE vec from_storage(storage s) {                                          \
    vec r;                                                                                 \
    r.v = s;                                                                               \
    return r;                                                                              \
  }                                                                                        \
  template <typename A>                                                                    \
  static MTW_INLINE void __fill(storage& s, int& i, A a) {                                 \
    if constexpr (__is_vec_v<A>) {                                                         \
      for (int k = 0; k < __vec_traits<remove_cvref_t<A>>::size; ++k)                      \
        s[i++] = __storage_of(T(a[k]));                                                    \
    } else {                                                                               \
      s[i++] = __storage_of(T(a));                                                         \
    }                                                                                      \
  }                                                                                        \
  MTW_INLINE T& operator[](int i) { return reinterpret_cast<T*>(this)[i]; }                \
  MTW_INLINE const T& operator[](int i) const {                                            \
    return reinterpret_cast<const T*>(this)[i];                                            \
  }                                                                                        \
  MTW_VEC_BINARY(+)                                                                        \
  MTW_VEC_BINARY(-)                                                                        \
  MTW_VEC_BINARY(*)                                                                        \
  MTW_VEC_BINARY(/)                                                                        \
  MTW_VEC_BINARY(%)                                                                        \
  MTW_VEC_BINARY(&)                                                                        \
  MTW_VEC_BINARY(|)                                                                        \
  MTW_VEC_BINARY(^)                                                                        \
  MTW_VEC_SHIFT(<<)                                                                        \
  MTW_VEC_SHIFT(>>)                                                                        \
  MTW_VEC_COMPARE(==, N)                                                                   \
  MTW_VEC_COMPARE(!=, N)                                                                   \
  MTW_VEC_COMPARE(<, N)                                                                    \
  MTW_VEC_COMPARE(<=, N)                                                                   \
  MTW_VEC_COMPARE(>, N)                                                                    \
  MTW_VEC_COMPARE(>=, N)                                                                   \
  friend MTW_INLINE vec operator-(vec a) { return from_storage(-a.v); }                    \
  friend MTW_INLINE vec operator+(vec a) { return a; }                                     \
  friend MTW_INLINE vec operator~(vec a) { return from_storage(~a.v); }                    \
  friend MTW_INLINE vec<bool, N> operator!(vec a) { return __mask_to_bool<N>(a.v == 0); }  \
  friend MTW_INLINE vec<bool, N> operator&&(vec a, vec b) {                                \
    return __mask_to_bool<N>((a.v != 0) & (b.v != 0));                                     \
  }                                                                                        \
  friend MTW_INLINE vec<bool, N> operator||(vec a, vec b) {                                \
    return __mask_to_bool<N>((a.v != 0) | (b.v != 0));                                     \
  }                                                                                        \
  MTW_INLINE vec& operator++() { return *this += T(1); }                                   \
  MTW_INLINE vec& operator--() { return *this -= T(1); }                                   \
  MTW_INLINE vec operator++(int) {                                                         \
    vec old = *this;                                                                       \
    *this += T(1);                                                                         \
    return old;                                                                            \
  }                                                                                        \
  MTW_INLINE vec operator--(int) {                                                         \
    vec old = *this;                                                                       \
    *this -= T(1);                                                                         \
    return old;                                                                            \
  }

template <typename T>
struct vec<T, 2> {
  union {
    typename __vec_storage_elem<T>::type v __attribute__((ext_vector_type(2)));
    struct { T x, y; };
    struct { T r, g; };
  };
  MTW_VEC_COMMON(2)
  MTW_SWIZZLES_2
};

template <typename T>
struct vec<T, 3> {
  union {
    typename __vec_storage_elem<T>::type v __attribute__((ext_vector_type(3)));
    struct { T x, y, z; };
    struct { T r, g, b; };
  };
  MTW_VEC_COMMON(3)
  MTW_SWIZZLES_3
};

template <typename T>
struct vec<T, 4> {
  union {
    typename __vec_storage_elem<T>::type v __attribute__((ext_vector_type(4)));
    struct { T x, y, z, w; };
    struct { T r, g, b, a; };
  };
  MTW_VEC_COMMON(4)
  MTW_SWIZZLES_4
};

template <typename To, typename ToElement, int N, typename FromVec>
MTW_INLINE To __convert_storage(FromVec from) {
  using from_element = remove_cvref_t<decltype(from[0])>;
  using to_element = remove_cvref_t<decltype(To()[0])>;
  if constexpr (is_same_v<ToElement, bool>) {
    return __builtin_convertvector(from != 0, To) & (To)1;  // nonzero becomes true
  } else if constexpr (is_integral_v<ToElement> && is_floating_point_v<from_element>) {
    // One component at a time: scalar casts saturate (-fno-strict-float-cast-overflow),
    // a vector conversion would not.
    To out;
    for (int i = 0; i < N; ++i) out[i] = ToElement(from[i]);
    return out;
  } else if constexpr ((is_same_v<from_element, half> && is_same_v<to_element, __bf16>) ||
                       (is_same_v<from_element, __bf16> && is_same_v<to_element, half>)) {
    // Through float, which holds both exactly, so the result is rounded once (to nearest
    // even): clang's backend cannot convert between the two 16-bit vector types directly.
    typedef float wide __attribute__((ext_vector_type(N)));
    if constexpr (is_same_v<to_element, __bf16>)
      return __mtw_round_bf16<N>(__builtin_convertvector(from, wide));
    return __builtin_convertvector(__builtin_convertvector(from, wide), To);
  } else if constexpr (is_same_v<to_element, __bf16>) {  // rounded in the shim, as above
    typedef float wide __attribute__((ext_vector_type(N)));
    return __mtw_round_bf16<N>(__builtin_convertvector(from, wide));
  } else {
    return __builtin_convertvector(from, To);
  }
}

template <int N, typename Mask>
MTW_INLINE vec<bool, N> __mask_to_bool(Mask m) {
  typedef unsigned char bytes __attribute__((ext_vector_type(N)));
  return vec<bool, N>::from_storage(__builtin_convertvector(m, bytes) & (bytes)1);
}

// Packed vectors (MSL specification, 2.2.3 "Packed Vector Types"): no padding, element
// alignment (packed_float3 is 12 bytes). They convert to and from vectors of their element
// type implicitly and of other element types explicitly, are built like vectors, and take
// the vector operators (computed as vectors, giving vectors).
#define MTW_PACKED_BINARY(op)                                                              \
  friend MTW_INLINE auto operator op(packed_vec a, packed_vec b) {                         \
    return __unpacked(a) op __unpacked(b);                                                 \
  }                                                                                        \
  friend MTW_INLINE auto operator op(packed_vec a, __unpacked b) {                         \
    return __unpacked(a) op b;                                                             \
  }                                                                                        \
  friend MTW_INLINE auto operator op(__unpacked a, packed_vec b) {                         \
    return a op __unpacked(b);                                                             \
  }                                                                                        \
  friend MTW_INLINE auto operator op(packed_vec a, T b) { return __unpacked(a) op b; }     \
  friend MTW_INLINE auto operator op(T a, packed_vec b) { return a op __unpacked(b); }
#define MTW_PACKED_ARITHMETIC(op)                                                          \
  MTW_PACKED_BINARY(op)                                                                    \
  MTW_INLINE packed_vec& operator op##=(__unpacked b) { return *this = __unpacked(*this) op b; }
#define MTW_PACKED_COMMON(N)                                                               \
  using __unpacked = vec<T, N>;                                                            \
  packed_vec() = default;                                                                  \
  MTW_INLINE packed_vec(vec<T, N> o) {                                                     \
    for (int i = 0; i < N; ++i) elements[i] = o[i];                                        \
  }                                                                                        \
  MTW_INLINE packed_vec(T s) : packed_vec(vec<T, N>(s)) {}                                 \
  MTW_INLINE packed_vec(std::initializer_list<T> list) : packed_vec(vec<T, N>(list)) {}    \
  template <typename A0, typename A1, typename... As,                                      \
            typename = enable_if_t<__component_count<A0, A1, As...>() == N>>               \
  MTW_INLINE packed_vec(A0 a0, A1 a1, As... as) : packed_vec(vec<T, N>(a0, a1, as...)) {}  \
  template <typename U, typename = enable_if_t<!is_same_v<U, T>>>                          \
  explicit MTW_INLINE packed_vec(vec<U, N> o) : packed_vec(vec<T, N>(o)) {}                \
  template <typename U, typename = enable_if_t<!is_same_v<U, T>>>                          \
  explicit MTW_INLINE packed_vec(packed_vec<U, N> o) : packed_vec(vec<T, N>(o)) {}         \
  MTW_INLINE T& operator[](int i) { return elements[i]; }                                  \
  MTW_INLINE const T& operator[](int i) const { return elements[i]; }                      \
  MTW_PACKED_ARITHMETIC(+)                                                                 \
  MTW_PACKED_ARITHMETIC(-)                                                                 \
  MTW_PACKED_ARITHMETIC(*)                                                                 \
  MTW_PACKED_ARITHMETIC(/)                                                                 \
  MTW_PACKED_ARITHMETIC(%)                                                                 \
  MTW_PACKED_ARITHMETIC(&)                                                                 \
  MTW_PACKED_ARITHMETIC(|)                                                                 \
  MTW_PACKED_ARITHMETIC(^)                                                                 \
  MTW_PACKED_ARITHMETIC(<<)                                                                \
  MTW_PACKED_ARITHMETIC(>>)                                                                \
  MTW_PACKED_BINARY(==)                                                                    \
  MTW_PACKED_BINARY(!=)                                                                    \
  MTW_PACKED_BINARY(<)                                                                     \
  MTW_PACKED_BINARY(<=)                                                                    \
  MTW_PACKED_BINARY(>)                                                                     \
  MTW_PACKED_BINARY(>=)                                                                    \
  friend MTW_INLINE vec<T, N> operator-(packed_vec a) { return -vec<T, N>(a); }

template <typename T>
struct packed_vec<T, 2> {
  union {
    T elements[2];
    struct { T x, y; };
    struct { T r, g; };
  };
  MTW_PACKED_COMMON(2)
};
template <typename T>
struct packed_vec<T, 3> {
  union {
    T elements[3];
    struct { T x, y, z; };
    struct { T r, g, b; };
  };
  MTW_PACKED_COMMON(3)
};
template <typename T>
struct packed_vec<T, 4> {
  union {
    T elements[4];
    struct { T x, y, z, w; };
    struct { T r, g, b, a; };
  };
  MTW_PACKED_COMMON(4)
};

#define MTW_VEC_FROM_PACKED(N)                                                             \
  template <typename T>                                                                    \
  MTW_INLINE vec<T, N>::vec(packed_vec<T, N> p) {                                          \
    for (int i = 0; i < N; ++i) (*this)[i] = p.elements[i];                                \
  }
MTW_VEC_FROM_PACKED(2)
MTW_VEC_FROM_PACKED(3)
MTW_VEC_FROM_PACKED(4)
#undef MTW_VEC_FROM_PACKED
#undef MTW_PACKED_COMMON
#undef MTW_PACKED_ARITHMETIC
#undef MTW_PACKED_BINARY
#undef MTW_VEC_SCALAR

// Calls mixing vectors and scalars. Metal's standard library functions take a vector with
// scalars (`fmax(0, v)`, `clamp(v, lo, hi)`, `select(0.0f, v, mask)`), each argument
// converting implicitly to the vector's type. `__vector_call_t<A...>` is the first vector
// argument's type (unpacked), provided every argument converts to it implicitly; the
// overload drops out otherwise.
template <typename A>
struct __unpacked {
  using type = A;
};
template <typename T, int N>
struct __unpacked<packed_vec<T, N>> {
  using type = vec<T, N>;
};
template <typename... A>
struct __first_vector {
  using type = void;
};
template <typename A, typename... R>
struct __first_vector<A, R...> {
  using type = conditional_t<__is_vec_v<A>, typename __unpacked<remove_cvref_t<A>>::type,
                             typename __first_vector<R...>::type>;
};
template <typename V, typename... A>
using __if_all_convert_t = enable_if_t<!is_void_v<V> && (is_convertible_v<A, V> && ...), V>;
template <typename... A>
using __vector_call_t = __if_all_convert_t<typename __first_vector<A...>::type, A...>;
template <typename... A>
using __float_vector_call_t =
    enable_if_t<is_floating_point_v<__elem_t<__vector_call_t<A...>>>, __vector_call_t<A...>>;

template <typename To, typename From>
MTW_INLINE To as_type(From x) {
  static_assert(sizeof(To) == sizeof(From), "as_type: the two types must have the same size");
  return __builtin_bit_cast(To, x);
}

}  // namespace metal

#define MTW_VECTOR_NAMES(T, name)                                                          \
  typedef metal::vec<T, 2> name##2;                                                        \
  typedef metal::vec<T, 3> name##3;                                                        \
  typedef metal::vec<T, 4> name##4;                                                        \
  typedef metal::packed_vec<T, 2> packed_##name##2;                                        \
  typedef metal::packed_vec<T, 3> packed_##name##3;                                        \
  typedef metal::packed_vec<T, 4> packed_##name##4;                                        \
  namespace metal {                                                                        \
  using ::name##2;                                                                         \
  using ::name##3;                                                                         \
  using ::name##4;                                                                         \
  using ::packed_##name##2;                                                                \
  using ::packed_##name##3;                                                                \
  using ::packed_##name##4;                                                                \
  }

MTW_VECTOR_NAMES(bool, bool)
MTW_VECTOR_NAMES(char, char)
MTW_VECTOR_NAMES(uchar, uchar)
MTW_VECTOR_NAMES(short, short)
MTW_VECTOR_NAMES(ushort, ushort)
MTW_VECTOR_NAMES(int, int)
MTW_VECTOR_NAMES(uint, uint)
MTW_VECTOR_NAMES(long, long)
MTW_VECTOR_NAMES(ulong, ulong)
MTW_VECTOR_NAMES(half, half)
MTW_VECTOR_NAMES(float, float)
MTW_VECTOR_NAMES(bfloat, bfloat)
#undef MTW_VECTOR_NAMES

using metal::as_type;
