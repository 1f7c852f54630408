#include "server/structured.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

namespace torchtpu::server {
namespace {

ApiError unknown_key(const std::string& param, const std::string& allowed) {
  return ApiError(400,
                  "'" + param + "' is not a field this server knows (expected " + allowed + ")",
                  "invalid_request_error", param, "unknown_parameter");
}

ApiError unsupported_schema(const std::string& param, const std::string& why) {
  return ApiError(400, "'" + param + "' " + why, "invalid_request_error", param,
                  "unsupported_schema");
}

// Schema keywords that only describe: nothing to enforce.
bool is_annotation(const std::string& key) {
  static const std::set<std::string> kAnnotations = {"description", "title", "default",  "examples",
                                                     "$schema",     "$id",   "$comment", "strict"};
  return kAnnotations.count(key) > 0;
}

// What the value of a JSON Schema keyword (2020-12's and draft 7's, annotations aside) holds.
// (A map's values that are not objects, such as dependencies' lists of names, are passed over.)
enum class Holds { kValue, kSchema, kSchemas, kSchemaOrSchemas, kSchemaMap };

const std::map<std::string, Holds>& schema_keywords() {
  using enum Holds;
  static const std::map<std::string, Holds> kKeywords = {
      {"$ref", kValue},
      {"$anchor", kValue},
      {"$dynamicRef", kValue},
      {"$dynamicAnchor", kValue},
      {"$recursiveRef", kValue},
      {"$recursiveAnchor", kValue},
      {"$vocabulary", kValue},
      {"$defs", kSchemaMap},
      {"definitions", kSchemaMap},
      {"type", kValue},
      {"enum", kValue},
      {"const", kValue},
      {"multipleOf", kValue},
      {"maximum", kValue},
      {"exclusiveMaximum", kValue},
      {"minimum", kValue},
      {"exclusiveMinimum", kValue},
      {"maxLength", kValue},
      {"minLength", kValue},
      {"pattern", kValue},
      {"format", kValue},
      {"maxItems", kValue},
      {"minItems", kValue},
      {"uniqueItems", kValue},
      {"maxContains", kValue},
      {"minContains", kValue},
      {"maxProperties", kValue},
      {"minProperties", kValue},
      {"required", kValue},
      {"dependentRequired", kValue},
      {"contentEncoding", kValue},
      {"contentMediaType", kValue},
      {"deprecated", kValue},
      {"readOnly", kValue},
      {"writeOnly", kValue},
      {"allOf", kSchemas},
      {"anyOf", kSchemas},
      {"oneOf", kSchemas},
      {"prefixItems", kSchemas},
      {"items", kSchemaOrSchemas},
      {"additionalItems", kSchema},
      {"unevaluatedItems", kSchema},
      {"contains", kSchema},
      {"not", kSchema},
      {"if", kSchema},
      {"then", kSchema},
      {"else", kSchema},
      {"additionalProperties", kSchema},
      {"unevaluatedProperties", kSchema},
      {"propertyNames", kSchema},
      {"contentSchema", kSchema},
      {"properties", kSchemaMap},
      {"patternProperties", kSchemaMap},
      {"dependentSchemas", kSchemaMap},
      {"dependencies", kSchemaMap},
  };
  return kKeywords;
}

// ApiError 400 naming the first key of `schema`, or of a schema inside it, that JSON Schema does
// not define: llguidance passes over keys it does not know, so a misspelled "requried" or
// OpenAPI's "nullable" would leave the output unheld to what the client meant (OpenAI's strict
// mode refuses them too). Annotations, extensions named "x-..." and OpenAPI's "discriminator"
// (pydantic writes it beside the oneOf that holds the union) only describe.
void check_schema_keywords(const ojson& schema, const std::string& path) {
  if (!schema.is_object()) return;  // true and false are schemas; other values llguidance names
  for (const auto& [key, value] : schema.items()) {
    const std::string p = path + "." + key;
    if (is_annotation(key) || key.starts_with("x-") || key == "discriminator") continue;
    const auto keyword = schema_keywords().find(key);
    if (keyword == schema_keywords().end()) {
      if (key == "nullable") {
        throw unsupported_schema(p,
                                 "is OpenAPI 3.0's, not JSON Schema's: write \"type\": [T, "
                                 "\"null\"], or anyOf with {\"type\": \"null\"}");
      }
      throw unsupported_schema(p,
                               "is not a JSON Schema keyword, so nothing would enforce it (a "
                               "misspelling? an extension is named \"x-...\")");
    }
    const Holds holds = keyword->second;
    if (holds == Holds::kSchema || (holds == Holds::kSchemaOrSchemas && !value.is_array())) {
      check_schema_keywords(value, p);
    } else if ((holds == Holds::kSchemas || holds == Holds::kSchemaOrSchemas) && value.is_array()) {
      for (size_t i = 0; i < value.size(); ++i) check_schema_keywords(value[i], at_index(p, i));
    } else if (holds == Holds::kSchemaMap && value.is_object()) {
      for (const auto& [name, sub] : value.items()) check_schema_keywords(sub, p + "." + name);
    }
  }
}

// A Lark string literal: JSON's escapes are Lark's.
std::string literal(const std::string& text) {
  return dump(ojson(text));
}

bool is_bare_key(const std::string& key) {
  if (key.empty() || std::isdigit(static_cast<unsigned char>(key[0]))) return false;
  for (char c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') {
      return false;
    }
  }
  return true;
}

// Writes one Lark rule per schema node; `rule()` returns the name of the node's rule.
class ToolGrammarWriter {
 public:
  explicit ToolGrammarWriter(const ToolCallTokens& tokens)
      : quote_("<[" + std::to_string(tokens.quote) + "]>"),
        open_("<[" + std::to_string(tokens.open) + "]>"),
        close_("<[" + std::to_string(tokens.close) + "]>") {}

  std::string grammar(const ojson& tools, const std::set<std::string>& callable, CallStart start,
                      bool one_call) {
    std::vector<std::string> calls;
    std::string first;
    for (size_t i = 0; i < tools.size(); ++i) {
      const ojson& function = tools[i]["function"];
      if (!callable.contains(function["name"].get<std::string>())) continue;
      const std::string path = "tools[" + std::to_string(i) + "].function.parameters";
      const auto parameters = function.find("parameters");
      std::string arguments = parameters == function.end() || parameters->is_null()
                                  ? braced(add("\"}\""))
                                  : rule(*parameters, path);
      if (arguments == "any_value") arguments = "any_object";
      if (arguments != "any_object" && after_brace_.count(arguments) == 0) {
        throw unsupported_schema(path,
                                 "must describe an object (\"type\": \"object\"): a call's "
                                 "arguments are one");
      }
      calls.push_back(add(literal(function["name"].get<std::string>()) + " " + arguments));
      if (calls.size() == 1) {
        first = arguments == "any_object" ? "any_object_rest" : after_brace_[arguments];
      }
    }
    std::string call = calls[0];
    for (size_t i = 1; i < calls.size(); ++i) call += " | " + calls[i];
    const std::string more = one_call ? "" : "(" + open_ + " \"call:\" call " + close_ + ")*";
    std::string out;
    switch (start) {
      case CallStart::kAfterCallPrefix: out = "start: call " + close_ + " " + more + "\n"; break;
      case CallStart::kInsideArguments:
        out = "start: " + first + " " + close_ + " " + more + "\n";
        break;
      case CallStart::kReply:
        // Text never holds a special token, so every <|tool_call> opens a call the parser reads.
        out = "start: FREE_TEXT? (" + open_ + " \"call:\" call " + close_ + " FREE_TEXT?)*\n";
        break;
    }
    out += "call: " + call + "\n";
    for (const auto& r : rules_) out += r + "\n";
    out += kCommonRules(quote_);
    return out;
  }

 private:
  // The free-form values (`{}` schemas) and the lexemes every rule shares. TEXT is a string's
  // text: anything without "<|", so no delimiter or marker can appear inside it.
  static std::string kCommonRules(const std::string& quote) {
    return "any_value: " + quote + " TEXT? " + quote +
           " | NUMBER | \"true\" | \"false\" | \"null\" | any_object | any_array\n"
           "any_object: \"{\" any_object_rest\n"
           "any_object_rest: (any_member (\",\" any_member)*)? \"}\"\n"
           "any_member: KEY \":\" any_value\n"
           "any_array: \"[\" (any_value (\",\" any_value)*)? \"]\"\n"
           "KEY: /[A-Za-z_][A-Za-z0-9_]*/\n"
           "FREE_TEXT: /(.|\\n)+/\n"
           "TEXT: /(([^<]|<+[^<|])+<*)|<+/\n"
           "NUMBER: /-?(0|[1-9][0-9]{0,15})(\\.[0-9]{1,15})?([eE][+-]?[0-9]{1,2})?/\n"
           "INTEGER: /-?(0|[1-9][0-9]{0,15})/\n";
  }

  std::string add(const std::string& expansion) {
    const std::string name = "r" + std::to_string(rules_.size());
    rules_.push_back(name + ": " + expansion);
    return name;
  }

  // A scalar written as the chat template writes it.
  std::string value_literal(const ojson& v, const std::string& path) {
    if (v.is_string()) {
      const auto text = v.get<std::string>();
      if (text.find("<|") != std::string::npos) {
        throw unsupported_schema(
            path, "holds \"<|\", which Gemma 4's call syntax cannot carry in a string");
      }
      return text.empty() ? quote_ + " " + quote_ : quote_ + " " + literal(text) + " " + quote_;
    }
    if (v.is_structured())
      throw unsupported_schema(path, "lists an array or object; only scalars are supported here");
    return literal(v.dump());
  }

  std::string rule(const ojson& schema, const std::string& path) {
    if (schema.is_boolean() && schema.get<bool>()) return "any_value";
    if (!schema.is_object()) throw wrong_type(path, "a JSON Schema object", schema);
    for (const auto& [key, value] : schema.items()) {
      static const std::set<std::string> kEnforced = {
          "type",  "properties", "required", "additionalProperties",
          "items", "enum",       "const",    "anyOf"};
      if (kEnforced.count(key) == 0 && !is_annotation(key)) {
        throw unsupported_schema(
            path + "." + key,
            "is not supported in constrained tool calls (supported: type, "
            "properties, required, additionalProperties, items, enum, const, anyOf "
            "and annotations such as description)");
      }
    }
    if (const ojson* c = field(schema, "const")) return add(value_literal(*c, path + ".const"));
    if (const ojson* e = field(schema, "enum")) {
      if (!e->is_array() || e->empty()) throw wrong_type(path + ".enum", "a non-empty array", *e);
      std::string alternatives;
      for (size_t i = 0; i < e->size(); ++i) {
        alternatives +=
            (i ? " | " : "") + value_literal((*e)[i], path + ".enum[" + std::to_string(i) + "]");
      }
      return add(alternatives);
    }
    if (const ojson* any = field(schema, "anyOf")) {
      if (!any->is_array() || any->empty()) {
        throw wrong_type(path + ".anyOf", "a non-empty array", *any);
      }
      std::string alternatives;
      for (size_t i = 0; i < any->size(); ++i) {
        alternatives +=
            (i ? " | " : "") + rule((*any)[i], path + ".anyOf[" + std::to_string(i) + "]");
      }
      return add(alternatives);
    }
    const ojson* type = field(schema, "type");
    if (!type) {
      if (field(schema, "properties")) return object_rule(schema, path);
      if (field(schema, "items")) return typed("array", schema, path);
      return "any_value";
    }
    if (type->is_string()) return typed(type->get<std::string>(), schema, path);
    if (!type->is_array() || type->empty()) {
      throw wrong_type(path + ".type", "a string or a non-empty array of strings", *type);
    }
    std::string alternatives;
    for (size_t i = 0; i < type->size(); ++i) {
      if (!(*type)[i].is_string()) {
        throw wrong_type(path + ".type[" + std::to_string(i) + "]", "a string", (*type)[i]);
      }
      alternatives += (i ? " | " : "") + typed((*type)[i].get<std::string>(), schema, path);
    }
    return add(alternatives);
  }

  std::string typed(const std::string& type, const ojson& schema, const std::string& path) {
    if (type == "string") return add(quote_ + " TEXT? " + quote_);
    if (type == "number") return add("NUMBER");
    if (type == "integer") return add("INTEGER");
    if (type == "boolean") return add("\"true\" | \"false\"");
    if (type == "null") return add("\"null\"");
    if (type == "object") return object_rule(schema, path);
    if (type == "array") {
      const ojson* items = field(schema, "items");
      const std::string item = items ? rule(*items, path + ".items") : "any_value";
      return add("\"[\" (" + item + " (\",\" " + item + ")*)? \"]\"");
    }
    throw ApiError(400,
                   "'" + path +
                       ".type' must be one of string, number, integer, boolean, null, "
                       "object, array; got \"" +
                       type + "\"",
                   "invalid_request_error", path + ".type", "invalid_value");
  }

  // Properties in the schema's order, each optional one skippable, the required ones always
  // written; no properties beyond the declared ones. No "properties": any members.
  std::string object_rule(const ojson& schema, const std::string& path) {
    const ojson* properties = field(schema, "properties");
    if (!properties) return "any_object";
    if (!properties->is_object()) throw wrong_type(path + ".properties", "an object", *properties);
    std::set<std::string> required;
    if (const ojson* r = field(schema, "required")) {
      if (!r->is_array()) throw wrong_type(path + ".required", "an array of strings", *r);
      for (size_t i = 0; i < r->size(); ++i) {
        const std::string p = path + ".required[" + std::to_string(i) + "]";
        if (!(*r)[i].is_string()) throw wrong_type(p, "a string", (*r)[i]);
        if (!properties->contains((*r)[i].get<std::string>())) {
          throw unsupported_schema(
              p, "names " + (*r)[i].dump() + ", which 'properties' does not declare");
        }
        required.insert((*r)[i].get<std::string>());
      }
    }
    std::vector<std::pair<std::string, bool>> members;  // "key:value" expansion, required
    for (const auto& [key, value] : properties->items()) {
      const std::string name =
          is_bare_key(key) ? literal(key) : quote_ + " " + literal(key) + " " + quote_;
      members.emplace_back(name + " \":\" " + rule(value, path + ".properties." + key),
                           required.count(key) > 0);
    }
    // list_i: members i.. with member i first; a skippable member may instead start at i+1.
    std::vector<std::string> lists(members.size());
    for (size_t i = members.size(); i-- > 0;) {
      std::string rest;
      for (size_t j = i + 1; j < members.size(); ++j) {
        rest +=
            members[j].second ? " \",\" " + members[j].first : " (\",\" " + members[j].first + ")?";
      }
      std::string expansion = members[i].first + rest;
      if (!members[i].second && i + 1 < members.size()) expansion += " | " + lists[i + 1];
      lists[i] = add(expansion);
    }
    std::string rest = "\"}\"";
    if (!members.empty())
      rest = (required.empty() ? "(" + lists[0] + ")? " : lists[0] + " ") + rest;
    return braced(add(rest));
  }

  // "{" then `rest`, remembered so that a call whose "{" is already in the prompt can start at it.
  std::string braced(const std::string& rest) {
    const std::string name = add("\"{\" " + rest);
    after_brace_[name] = rest;
    return name;
  }

  std::string quote_, open_, close_;
  std::vector<std::string> rules_;
  std::map<std::string, std::string> after_brace_;
};

// OpenAI's rule for a json_schema format's name: 1 to 64 of a-z, A-Z, 0-9, '_' and '-'.
void check_format_name(const std::string& name, const std::string& param) {
  const bool allowed =
      !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '-';
      });
  if (!allowed) {
    throw invalid(param, "must be 1 to 64 letters, digits, '_' or '-', got " + ojson(name).dump());
  }
}

}  // namespace

std::optional<Grammar> parse_response_format(const ojson& body) {
  const ojson* format = field(body, "response_format");
  if (!format) return std::nullopt;
  if (!format->is_object()) throw wrong_type("response_format", "an object", *format);
  const ojson* type = field(*format, "type");
  if (!type) throw missing("response_format.type");
  if (!type->is_string()) throw wrong_type("response_format.type", "a string", *type);
  for (const auto& [key, value] : format->items()) {
    if (key != "type" && !(key == "json_schema" && *type == "json_schema")) {
      throw unknown_key("response_format." + key, *type == "json_schema"
                                                      ? "type and json_schema"
                                                      : "only type for " + type->dump());
    }
  }
  if (*type == "text") return std::nullopt;
  if (*type == "json_object") return Grammar{GrammarKind::kJsonObject, ""};
  if (*type != "json_schema") {
    throw ApiError(400,
                   "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", "
                   "got " +
                       type->dump(),
                   "invalid_request_error", "response_format.type", "invalid_value");
  }
  const ojson* spec = field(*format, "json_schema");
  if (!spec) throw missing("response_format.json_schema");
  if (!spec->is_object()) throw wrong_type("response_format.json_schema", "an object", *spec);
  for (const auto& [key, value] : spec->items()) {
    const std::string p = "response_format.json_schema." + key;
    if (key == "name" || key == "description") {
      if (!value.is_string()) throw wrong_type(p, "a string", value);
      if (key == "name") check_format_name(value.get<std::string>(), p);
    } else if (key == "strict") {
      if (!value.is_boolean() && !value.is_null()) throw wrong_type(p, "a boolean", value);
    } else if (key != "schema") {
      throw unknown_key(p, "name, description, schema and strict");
    }
  }
  const ojson* schema = field(*spec, "schema");
  // OpenAI makes the schema optional: without one the answer is a JSON object, as json_object's.
  if (!schema) return Grammar{GrammarKind::kJsonObject, ""};
  if (!schema->is_object()) {
    throw wrong_type("response_format.json_schema.schema", "a JSON Schema object", *schema);
  }
  check_schema_keywords(*schema, "response_format.json_schema.schema");
  return Grammar{GrammarKind::kJsonSchema, schema->dump()};
}

std::string tool_call_grammar(const ojson& tools, const std::set<std::string>& callable,
                              const ToolCallTokens& tokens, CallStart start, bool one_call) {
  return ToolGrammarWriter(tokens).grammar(tools, callable, start, one_call);
}

}  // namespace torchtpu::server
