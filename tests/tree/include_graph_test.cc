// The include graph of the libraries' own files (Note [Include graph]): no circle of headers, no
// circle of units, and no include that the libraries' CMake dependencies do not allow.
//
// Note [Include graph]
// The libraries (core, ops/local, mesh, dtensor, ops, loaders, nn, nn/models: every dt_library)
// are read as files and their `#include "dtensor/..."` lines. Three rules:
//   - headers: no header reaches itself through the headers it includes;
//   - units: a unit is a file without its ending (loaders/gguf is gguf.h and gguf.cc); unit A
//     uses unit B when a file of A includes a header of B. No unit uses itself through others:
//     two units that need each other are one thing in two files, or hold a piece that belongs
//     below both (a type both use, moved to a header of its own);
//   - layers: a file of library L includes only headers of L and of the libraries L depends on,
//     directly or through others, as the CMake targets declare them (PUBLIC_DEPS and PRIVATE_DEPS
//     of dt_library). tests/tree/CMakeLists.txt writes those at configure time (layers.txt), so
//     the rule is the build's own, never a second copy.
// Any circle fails the test: there is no list of tolerated ones.

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "dtensor/tests/test_util.h"

namespace dt {
namespace {

namespace fs = std::filesystem;

// One dt_library: its target, its directory (relative to the source root) and the dt_ libraries
// it links, as declared.
struct Library {
  std::string name;
  std::string dir;
  std::vector<std::string> deps;
};

// An include of a project header: `to` is the header's path below the root ("core/tensor.h").
struct Include {
  int line = 0;
  std::string to;
};

// Every file of the libraries (path below the root) and its project includes.
using Tree = std::map<std::string, std::vector<Include>>;

// layers.txt: one line per library, "dt_loaders loaders dt_dtensor dt_ops_local dt_core".
std::vector<Library> ParseLayers(absl::string_view text) {
  std::vector<Library> libs;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.size() < 2) continue;
    libs.push_back({words[0], words[1], std::vector<std::string>(words.begin() + 2, words.end())});
  }
  return libs;
}

// The `#include "dtensor/X"` lines of a file, as X.
std::vector<Include> ProjectIncludes(absl::string_view text) {
  std::vector<Include> out;
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++n;
    line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "#")) continue;
    line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "include")) continue;
    line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "\"dtensor/")) continue;
    const size_t end = line.find('"');
    if (end != absl::string_view::npos) out.push_back({n, std::string(line.substr(0, end))});
  }
  return out;
}

// The library a path belongs to: the one whose directory is the longest prefix of it (nn/models
// before nn); nullptr for a path in none.
const Library* LibraryOf(const std::vector<Library>& libs, absl::string_view path) {
  const Library* best = nullptr;
  for (const Library& lib : libs) {
    if (absl::StartsWith(path, absl::StrCat(lib.dir, "/")) &&
        (best == nullptr || lib.dir.size() > best->dir.size())) {
      best = &lib;
    }
  }
  return best;
}

Tree ReadTree(const std::string& root, const std::vector<Library>& libs) {
  Tree tree;
  for (const Library& lib : libs) {
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(fs::path(root) / lib.dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".inc")) continue;
      const std::string rel = fs::relative(e.path(), root).generic_string();
      if (LibraryOf(libs, rel) != &lib) continue;  // a library below this one (nn/models in nn)
      tree[rel] = ProjectIncludes(testing::ReadFileBytes(e.path().string()));
    }
  }
  return tree;
}

std::string UnitOf(absl::string_view path) {
  const size_t dot = path.rfind('.');
  return std::string(dot == absl::string_view::npos ? path : path.substr(0, dot));
}

bool IsHeader(absl::string_view path) { return absl::EndsWith(path, ".h"); }

// A directed graph whose every edge remembers one include that makes it ("a.cc:12").
struct Graph {
  std::map<std::string, std::map<std::string, std::string>> edges;  // from -> to -> witness
  std::set<std::string> nodes;
  void Add(const std::string& from, const std::string& to, std::string witness) {
    nodes.insert(from);
    nodes.insert(to);
    edges[from].emplace(to, std::move(witness));
  }
};

std::string Witness(const std::string& file, const Include& inc) {
  return absl::StrCat(file, ":", inc.line, " includes ", inc.to);
}

Graph HeaderGraph(const Tree& tree) {
  Graph g;
  for (const auto& [file, incs] : tree) {
    if (!IsHeader(file)) continue;
    for (const Include& inc : incs) {
      if (IsHeader(inc.to) && inc.to != file) g.Add(file, inc.to, Witness(file, inc));
    }
  }
  return g;
}

Graph UnitGraph(const Tree& tree) {
  Graph g;
  for (const auto& [file, incs] : tree) {
    for (const Include& inc : incs) {
      if (UnitOf(inc.to) != UnitOf(file)) g.Add(UnitOf(file), UnitOf(inc.to), Witness(file, inc));
    }
  }
  return g;
}

// The strongly connected components with more than one node (Tarjan), each sorted.
std::vector<std::vector<std::string>> Circles(const Graph& g) {
  std::map<std::string, int> index, low;
  std::set<std::string> on_stack;
  std::vector<std::string> stack;
  std::vector<std::vector<std::string>> out;
  int next = 0;
  std::function<void(const std::string&)> visit = [&](const std::string& v) {
    index[v] = low[v] = next++;
    stack.push_back(v);
    on_stack.insert(v);
    if (auto it = g.edges.find(v); it != g.edges.end()) {
      for (const auto& [w, witness] : it->second) {
        if (!index.contains(w)) {
          visit(w);
          low[v] = std::min(low[v], low[w]);
        } else if (on_stack.contains(w)) {
          low[v] = std::min(low[v], index[w]);
        }
      }
    }
    if (low[v] != index[v]) return;
    std::vector<std::string> component;
    std::string w;
    do {
      w = stack.back();
      stack.pop_back();
      on_stack.erase(w);
      component.push_back(w);
    } while (w != v);
    if (component.size() > 1) {
      std::sort(component.begin(), component.end());
      out.push_back(std::move(component));
    }
  };
  for (const std::string& v : g.nodes) {
    if (!index.contains(v)) visit(v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// One shortest way round a component from its first node, as the includes that make it.
std::string DescribeCircle(const Graph& g, const std::vector<std::string>& component) {
  const std::set<std::string> in(component.begin(), component.end());
  const std::string& start = component.front();
  std::map<std::string, std::string> parent;
  std::vector<std::string> queue = {start};
  std::string last;
  for (size_t i = 0; i < queue.size() && last.empty(); ++i) {
    for (const auto& [w, witness] : g.edges.at(queue[i])) {
      if (!in.contains(w)) continue;
      if (w == start) {
        last = queue[i];
        break;
      }
      if (parent.emplace(w, queue[i]).second) queue.push_back(w);
    }
  }
  std::vector<std::string> steps = {g.edges.at(last).at(start)};
  for (std::string v = last; v != start; v = parent.at(v)) {
    steps.push_back(g.edges.at(parent.at(v)).at(v));
  }
  std::reverse(steps.begin(), steps.end());
  return absl::StrCat("{", absl::StrJoin(component, ", "), "}: ", absl::StrJoin(steps, ", "));
}

std::vector<std::string> HeaderCircles(const Tree& tree) {
  const Graph g = HeaderGraph(tree);
  std::vector<std::string> out;
  for (const auto& c : Circles(g)) out.push_back("headers in a circle " + DescribeCircle(g, c));
  return out;
}

std::vector<std::string> UnitCircles(const Tree& tree) {
  const Graph g = UnitGraph(tree);
  std::vector<std::string> out;
  for (const auto& c : Circles(g)) out.push_back("units in a circle " + DescribeCircle(g, c));
  return out;
}

// Includes that run against the declared dependencies (or reach outside every library).
std::vector<std::string> LayerViolations(const Tree& tree, const std::vector<Library>& libs) {
  std::map<std::string, const Library*> by_name;
  for (const Library& lib : libs) by_name[lib.name] = &lib;
  auto below = [&](const Library& lib) {  // lib and everything it depends on
    std::set<std::string> seen = {lib.name};
    std::vector<const Library*> todo = {&lib};
    while (!todo.empty()) {
      const Library* l = todo.back();
      todo.pop_back();
      for (const std::string& d : l->deps) {
        if (by_name.contains(d) && seen.insert(d).second) todo.push_back(by_name.at(d));
      }
    }
    return seen;
  };
  std::vector<std::string> out;
  for (const auto& [file, incs] : tree) {
    const Library* lib = LibraryOf(libs, file);
    const std::set<std::string> allowed = below(*lib);
    for (const Include& inc : incs) {
      const Library* target = LibraryOf(libs, inc.to);
      if (target != nullptr && allowed.contains(target->name)) continue;
      out.push_back(absl::StrCat(
          Witness(file, inc), ": ", lib->name, " sees ", absl::StrJoin(allowed, ", "),
          " (itself and its CMake deps), not ", target == nullptr ? "a file of no library" : target->name));
    }
  }
  return out;
}

// ---- the rules on small trees ------------------------------------------------------------------

const std::vector<Library> kToyLayers = {
    {"dt_core", "core", {}}, {"dt_mesh", "mesh", {"dt_core"}}, {"dt_nn", "nn", {"dt_mesh"}},
    {"dt_models", "nn/models", {"dt_nn"}}};

TEST(IncludeGraph, ParsesIncludesAndLayers) {
  const std::vector<Include> incs = ProjectIncludes(
      "#pragma once\n#include <vector>\n#include \"absl/x.h\"\n  #  include \"dtensor/core/a.h\"  // why\n"
      "// #include \"dtensor/core/comment.h\"\n#include \"dtensor/nn/b.h\"\n");
  ASSERT_EQ(incs.size(), 2u);
  EXPECT_EQ(incs[0].line, 4);
  EXPECT_EQ(incs[0].to, "core/a.h");
  EXPECT_EQ(incs[1].to, "nn/b.h");
  const std::vector<Library> libs = ParseLayers("dt_core core\ndt_nn nn dt_mesh dt_core\n");
  ASSERT_EQ(libs.size(), 2u);
  EXPECT_EQ(libs[1].dir, "nn");
  EXPECT_EQ(libs[1].deps, (std::vector<std::string>{"dt_mesh", "dt_core"}));
  EXPECT_EQ(LibraryOf(kToyLayers, "nn/models/m.h")->name, "dt_models");
  EXPECT_EQ(LibraryOf(kToyLayers, "nn/m.h")->name, "dt_nn");
  EXPECT_EQ(LibraryOf(kToyLayers, "tools/flags.h"), nullptr);
}

TEST(IncludeGraph, FindsHeadersInACircle) {
  const Tree tree = {{"core/a.h", {{3, "core/b.h"}}},
                     {"core/b.h", {{4, "core/c.h"}}},
                     {"core/c.h", {{5, "core/a.h"}}},
                     {"core/d.h", {{6, "core/a.h"}}}};
  const std::vector<std::string> found = HeaderCircles(tree);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0],
            "headers in a circle {core/a.h, core/b.h, core/c.h}: core/a.h:3 includes core/b.h, "
            "core/b.h:4 includes core/c.h, core/c.h:5 includes core/a.h");
}

TEST(IncludeGraph, FindsUnitsInACircleThroughTheirSources) {
  // No header includes another, yet each source needs the other's header.
  const Tree tree = {{"core/a.h", {}}, {"core/a.cc", {{1, "core/a.h"}, {2, "core/b.h"}}},
                     {"core/b.h", {}}, {"core/b.cc", {{1, "core/b.h"}, {2, "core/a.h"}}},
                     {"core/c.cc", {{1, "core/a.h"}}}};
  EXPECT_TRUE(HeaderCircles(tree).empty());
  const std::vector<std::string> found = UnitCircles(tree);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0],
            "units in a circle {core/a, core/b}: core/a.cc:2 includes core/b.h, core/b.cc:2 "
            "includes core/a.h");
  // Three units, each source needing the next one's header: one circle of three.
  const Tree larger = {{"core/a.cc", {{2, "core/b.h"}}}, {"core/b.cc", {{2, "core/c.h"}}},
                       {"core/c.cc", {{2, "core/a.h"}}}};
  const std::vector<std::string> three = UnitCircles(larger);
  ASSERT_EQ(three.size(), 1u);
  EXPECT_TRUE(three[0].starts_with("units in a circle {core/a, core/b, core/c}")) << three[0];
}

TEST(IncludeGraph, FindsIncludesAgainstTheLayers) {
  const Tree tree = {{"core/a.cc", {{7, "mesh/m.h"}}},          // upward
                     {"mesh/m.cc", {{1, "core/a.h"}}},          // downward: allowed
                     {"nn/n.cc", {{2, "core/a.h"}}},            // two layers down: allowed
                     {"nn/models/x.cc", {{3, "tools/flags.h"}}},  // outside every library
                     {"mesh/p.cc", {{4, "nn/models/x.h"}}}};
  const std::vector<std::string> found = LayerViolations(tree, kToyLayers);
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0], "core/a.cc:7 includes mesh/m.h: dt_core sees dt_core (itself and its CMake deps), not dt_mesh");
  EXPECT_EQ(found[1], "mesh/p.cc:4 includes nn/models/x.h: dt_mesh sees dt_core, dt_mesh (itself and its CMake deps), "
            "not dt_models");
  EXPECT_EQ(found[2],
            "nn/models/x.cc:3 includes tools/flags.h: dt_models sees dt_core, dt_mesh, dt_models, dt_nn "
            "(itself and its CMake deps), not a file of no library");
}

// ---- the source tree ---------------------------------------------------------------------------

TEST(IncludeGraph, SourceTreeHasNoCircleAndKeepsItsLayers) {
  const std::vector<Library> libs = ParseLayers(testing::ReadFileBytes(DT_LAYERS_FILE));
  ASSERT_GE(libs.size(), 8u) << "layers from " << DT_LAYERS_FILE;
  const Tree tree = ReadTree(DT_SOURCE_DIR, libs);
  ASSERT_GE(tree.size(), 200u);
  for (const std::string& problem : HeaderCircles(tree)) ADD_FAILURE() << problem;
  for (const std::string& problem : UnitCircles(tree)) ADD_FAILURE() << problem;
  for (const std::string& problem : LayerViolations(tree, libs)) ADD_FAILURE() << problem;
}

}  // namespace
}  // namespace dt
